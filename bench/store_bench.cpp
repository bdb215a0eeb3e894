// SSD tier throughput against the raw disk, measured in the same run on the same file system:
//   raw:   O_DIRECT sequential pwrite (then fdatasync) and pread of one preallocated file in
//          4 MiB requests, the ceiling for any store on this disk;
//   store: SsdTier::put (the chunks of one conversation item, fdatasync and a journal record per
//          chunk, like a demotion) and SsdTier::get (one item per call, like a load), with the
//          tier's codec applied on the way in and out as the store does.
// Chunks hold float32 values drawn from a normal distribution (KV-like: no repeated patterns for
// a lossless codec to find beyond the float format's own redundancy). Prints one JSON object;
// ratios are store / raw; with --codec zstd also the bytes stored per raw byte.
//
//   build/bench/store_bench [--dir DIR] [--mib 1024] [--chunk-bytes 737280] [--item-chunks 16]
//                           [--codec identity|zstd]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/store/codec.h"
#include "strata/store/ssd_tier.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using strata::store::AlignedBuffer;

// `bytes` of float32 samples of N(0, 1) (a fixed xorshift stream through Box-Muller).
void fill_normal(std::byte* dst, int64_t bytes, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto uniform = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;
  };
  auto* f = reinterpret_cast<float*>(dst);
  for (int64_t i = 0; i < bytes / 4; ++i) {
    f[i] = static_cast<float>(std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307 * uniform()));
  }
}

// {write GB/s, read GB/s} of O_DIRECT sequential I/O over `bytes` in 4 MiB requests.
std::pair<double, double> raw_disk(const std::string& path, int64_t bytes) {
  constexpr int64_t kRequest = 4 << 20;
  AlignedBuffer buffer(kRequest);
  fill_normal(buffer.data(), kRequest, 1);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0 || ::posix_fallocate(fd, 0, bytes) != 0) {
    std::cerr << path << ": cannot open or reserve: " << std::strerror(errno) << "\n";
    std::exit(1);
  }
  Clock::time_point start = Clock::now();
  for (int64_t off = 0; off < bytes; off += kRequest) {
    if (::pwrite(fd, buffer.data(), kRequest, off) != kRequest) std::exit(1);
  }
  ::fdatasync(fd);
  const double write = static_cast<double>(bytes) / seconds_since(start) / 1e9;
  start = Clock::now();
  for (int64_t off = 0; off < bytes; off += kRequest) {
    if (::pread(fd, buffer.data(), kRequest, off) != kRequest) std::exit(1);
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
  strata::store::CodecKind codec = strata::store::CodecKind::kIdentity;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") dir = argv[i + 1];
    else if (flag == "--mib") mib = std::stoll(argv[i + 1]);
    else if (flag == "--chunk-bytes") chunk_bytes = std::stoll(argv[i + 1]);
    else if (flag == "--item-chunks") item_chunks = std::stoll(argv[i + 1]);
    else if (flag == "--codec") {
      const std::string name = argv[i + 1];
      if (name != "identity" && name != "zstd") {
        std::cerr << "--codec: identity or zstd, got " << name << "\n";
        return 2;
      }
      codec = name == "zstd" ? strata::store::CodecKind::kZstd : strata::store::CodecKind::kIdentity;
    }
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int64_t bytes = mib << 20;
  const auto [raw_write, raw_read] = raw_disk(dir + "/raw.bin", bytes);

  namespace store = strata::store;
  store::SsdOptions options;
  options.dir = dir + "/ssd";
  options.capacity_bytes = bytes;
  options.file_bytes = int64_t{256} << 20;
  options.codec = codec;
  std::vector<store::RecoveredItem> recovered;
  auto tier = store::SsdTier::open(options, &recovered);
  if (!tier.ok()) {
    std::cerr << tier.status().to_string() << "\n";
    return 1;
  }
  store::SsdTier& ssd = **tier;
  std::vector<AlignedBuffer> chunks;
  for (int64_t c = 0; c < item_chunks; ++c) {
    fill_normal(chunks.emplace_back(chunk_bytes).data(), chunk_bytes, static_cast<uint64_t>(c));
  }
  // The values as the tier stores them, timed like the store's demotion (encode, reserve, put).
  std::vector<int64_t> sizes;
  std::vector<int32_t> indices;
  Clock::time_point start = Clock::now();
  int64_t items = 0, stored = 0;
  std::vector<AlignedBuffer> encoded;
  std::vector<std::span<const std::byte>> values;
  for (int64_t c = 0; c < item_chunks; ++c) {
    if (codec == store::CodecKind::kIdentity) {
      values.push_back(chunks[c].bytes());
    } else {
      std::vector<std::byte> out;
      if (!store::encode(codec, chunks[c].bytes(), &out).ok()) return 1;
      AlignedBuffer& b = encoded.emplace_back(std::ssize(out));
      std::copy(out.begin(), out.end(), b.data());
      values.push_back(b.bytes());
    }
    sizes.push_back(std::ssize(values.back()));
    indices.push_back(static_cast<int32_t>(c));
    stored += sizes.back();
  }
  const double encode_seconds = seconds_since(start);
  start = Clock::now();
  while (std::optional<store::Reservation> room = ssd.reserve(sizes)) {
    std::vector<store::ChunkKey> keys;
    for (int64_t c = 0; c < item_chunks; ++c) {
      keys.push_back({static_cast<uint64_t>(items + 1), static_cast<int32_t>(c), {}});
    }
    if (!ssd.put({}, *room, keys, values).ok()) return 1;
    ++items;
  }
  const double moved = static_cast<double>(items * item_chunks * chunk_bytes);
  const double store_write = moved / (seconds_since(start) + encode_seconds * items) / 1e9;
  start = Clock::now();
  std::vector<AlignedBuffer> got(static_cast<size_t>(item_chunks));
  AlignedBuffer raw(chunk_bytes);
  for (int64_t i = 0; i < items; ++i) {
    if (!ssd.get(static_cast<uint64_t>(i + 1), indices, got).ok()) return 1;
    for (const AlignedBuffer& g : got) {
      if (!store::decode(codec, g.bytes(), {raw.data(), static_cast<size_t>(chunk_bytes)}).ok()) {
        return 1;
      }
    }
  }
  const double store_read = moved / seconds_since(start) / 1e9;

  nlohmann::json out = {
      {"bytes", items * item_chunks * chunk_bytes}, {"chunk_bytes", chunk_bytes},
      {"item_chunks", item_chunks}, {"direct_io", ssd.direct_io()},
      {"codec", store::codec_name(codec)},
      {"stored_bytes_per_raw_byte", static_cast<double>(stored) / static_cast<double>(item_chunks * chunk_bytes)},
      {"raw_write_gbps", raw_write}, {"raw_read_gbps", raw_read},
      {"store_write_gbps", store_write}, {"store_read_gbps", store_read},
      {"write_fraction_of_raw", store_write / raw_write},
      {"read_fraction_of_raw", store_read / raw_read}};
  std::cout << out.dump(2) << "\n";
  tier->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
