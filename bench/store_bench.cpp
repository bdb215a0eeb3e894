// SSD tier throughput against the raw disk, measured in the same run on the same file system:
//   raw:   O_DIRECT sequential pwrite (then fdatasync) and pread of one preallocated file in
//          4 MiB requests, the ceiling for any store on this disk;
//   store: SsdTier::write (extents of one conversation item, fdatasync and a journal record per
//          item, like a demotion) and SsdTier::read (one item per call, like a load).
// Prints one JSON object; ratios are store / raw.
//
//   build/bench/store_bench [--dir DIR] [--mib 1024] [--chunk-bytes 737280] [--item-chunks 16]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/store/ssd_tier.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(4096, bytes))), size(bytes) {
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::byte>(i * 131 + 7);
  }
  ~AlignedBuffer() { std::free(data); }
  std::byte* data;
  size_t size;
};

// {write GB/s, read GB/s} of O_DIRECT sequential I/O over `bytes` in 4 MiB requests.
std::pair<double, double> raw_disk(const std::string& path, int64_t bytes) {
  constexpr int64_t kRequest = 4 << 20;
  AlignedBuffer buffer(kRequest);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0 || ::posix_fallocate(fd, 0, bytes) != 0) {
    std::cerr << path << ": cannot open or reserve: " << std::strerror(errno) << "\n";
    std::exit(1);
  }
  Clock::time_point start = Clock::now();
  for (int64_t off = 0; off < bytes; off += kRequest) {
    if (::pwrite(fd, buffer.data, kRequest, off) != kRequest) std::exit(1);
  }
  ::fdatasync(fd);
  const double write = static_cast<double>(bytes) / seconds_since(start) / 1e9;
  start = Clock::now();
  for (int64_t off = 0; off < bytes; off += kRequest) {
    if (::pread(fd, buffer.data, kRequest, off) != kRequest) std::exit(1);
  }
  const double read = static_cast<double>(bytes) / seconds_since(start) / 1e9;
  ::close(fd);
  ::unlink(path.c_str());
  return {write, read};
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "build/store-bench";
  int64_t mib = 1024, chunk_bytes = 737280, item_chunks = 16;  // SmolLM2-135M fp32, 16 tokens
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") dir = argv[i + 1];
    else if (flag == "--mib") mib = std::stoll(argv[i + 1]);
    else if (flag == "--chunk-bytes") chunk_bytes = std::stoll(argv[i + 1]);
    else if (flag == "--item-chunks") item_chunks = std::stoll(argv[i + 1]);
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int64_t bytes = mib << 20;
  const auto [raw_write, raw_read] = raw_disk(dir + "/raw.bin", bytes);

  strata::store::SsdOptions options;
  options.dir = dir + "/ssd";
  options.slot_bytes = (chunk_bytes + 4095) / 4096 * 4096;
  options.capacity_bytes = bytes;
  options.file_bytes = int64_t{256} << 20;
  std::vector<strata::store::RecoveredItem> recovered;
  auto tier = strata::store::SsdTier::open(options, &recovered);
  if (!tier.ok()) {
    std::cerr << tier.status().to_string() << "\n";
    return 1;
  }
  strata::store::SsdTier& ssd = **tier;
  const int64_t items = ssd.num_slots() / item_chunks;
  AlignedBuffer chunk(static_cast<size_t>(options.slot_bytes * item_chunks));
  std::vector<const std::byte*> sources;
  std::vector<std::byte*> destinations;
  for (int64_t c = 0; c < item_chunks; ++c) {
    sources.push_back(chunk.data + c * options.slot_bytes);
    destinations.push_back(chunk.data + c * options.slot_bytes);
  }
  std::vector<std::vector<int64_t>> slots;
  Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < items; ++i) {
    slots.push_back(ssd.allocate(item_chunks).value());
    std::vector<strata::store::ChunkRecord> records;
    for (int64_t c = 0; c < item_chunks; ++c) {
      records.push_back({static_cast<uint64_t>(i + 1), static_cast<int32_t>(c), {}, slots.back()[c], 0});
    }
    if (!ssd.write(slots.back(), sources).ok() || !ssd.journal_put({}, records).ok()) return 1;
  }
  const double moved = static_cast<double>(items * item_chunks * chunk_bytes);
  const double store_write = moved / seconds_since(start) / 1e9;
  start = Clock::now();
  for (int64_t i = 0; i < items; ++i) {
    if (!ssd.read(slots[i], destinations).ok()) return 1;
  }
  const double store_read = moved / seconds_since(start) / 1e9;

  nlohmann::json out = {
      {"bytes", items * item_chunks * chunk_bytes}, {"chunk_bytes", chunk_bytes},
      {"item_chunks", item_chunks}, {"direct_io", ssd.direct_io()},
      {"raw_write_gbps", raw_write}, {"raw_read_gbps", raw_read},
      {"store_write_gbps", store_write}, {"store_read_gbps", store_read},
      {"write_fraction_of_raw", store_write / raw_write},
      {"read_fraction_of_raw", store_read / raw_read}};
  std::cout << out.dump(2) << "\n";
  tier->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
