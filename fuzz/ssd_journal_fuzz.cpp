// SSD tier recovery on an arbitrary journal: open() replays it into an index and compacts it, and
// the tier it gives back serves only values whose checksums hold. The seed journal is written by
// a real tier: run with STRATA_FUZZ_WRITE_SEED=FILE (scripts/fuzz.sh does).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/store/ssd_tier.h"

namespace {

using strata::store::AlignedBuffer;
using strata::store::ChunkKey;
using strata::store::ItemRecord;
using strata::store::RecoveredItem;
using strata::store::SsdOptions;
using strata::store::SsdTier;

SsdOptions options(const std::string& dir) {
  SsdOptions o;
  o.dir = dir;
  o.capacity_bytes = 64 << 10;
  o.file_bytes = 32 << 10;
  o.layout_tag = 0x5eed;
  o.direct_io = false;
  return o;
}

// A directory of this process in memory (/dev/shm) where there is one, removed at exit by the
// destructor of the static that owns its name (an atexit handler registered while that static is
// being built runs after it is destroyed).
const std::string& work_dir() {
  struct WorkDir {
    std::string path;
    ~WorkDir() { std::filesystem::remove_all(path); }
  };
  static const WorkDir dir = [] {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm")
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    const std::string path = (base / ("strata-journal-fuzz-" + std::to_string(getpid()))).string();
    std::filesystem::create_directories(path);
    return WorkDir{path};  // built in place: no temporary whose destructor removes the directory
  }();
  return dir.path;
}

// Three items of two chunks, the second evicted, one with a session and a codec.
void write_seed(const char* path) {
  const std::string dir = work_dir() + "-seed";
  std::filesystem::remove_all(dir);
  std::vector<RecoveredItem> none;
  auto tier = SsdTier::open(options(dir), &none).value();
  for (strata::store::ItemId item = 1; item <= 3; ++item) {
    const std::vector<int64_t> sizes = {5000, 300};
    auto reservation = tier->reserve(sizes).value();
    std::vector<ChunkKey> keys(2);
    // put() reads values up to their page-rounded footprint, from aligned memory.
    std::vector<AlignedBuffer> bytes;
    std::vector<std::span<const std::byte>> values;
    for (int i = 0; i < 2; ++i) {
      keys[i].item = item;
      keys[i].index = i;
      keys[i].hash.low = item * 100 + i;
      bytes.emplace_back(sizes[i]);
      std::fill_n(bytes.back().data(), sizes[i], std::byte(item));
      values.push_back(bytes.back().bytes());
    }
    ItemRecord record;
    if (item == 3) {
      record.session = "conversation";
      record.codec = "kivi-4";
      record.token_offset = 7;
    }
    if (!tier->put(record, reservation, keys, values).ok()) std::abort();
    if (item == 2 && !tier->evict(item).ok()) std::abort();
  }
  tier.reset();
  std::filesystem::copy_file(dir + "/index.journal", path,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::remove_all(dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // recovery logs what it skips: once per input here
  if (const char* seed = std::getenv("STRATA_FUZZ_WRITE_SEED")) {
    write_seed(seed);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = work_dir();
  {
    std::ofstream journal(dir + "/index.journal", std::ios::binary | std::ios::trunc);
    journal.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  std::vector<RecoveredItem> recovered;
  auto tier = SsdTier::open(options(dir), &recovered);
  if (!tier.ok()) return 0;
  // What recovery kept is readable, or reported as corrupt: never a fault.
  for (const RecoveredItem& item : recovered) {
    std::vector<int32_t> indices;
    for (const ChunkKey& key : item.chunks) indices.push_back(key.index);
    std::vector<AlignedBuffer> out(indices.size());
    (void)(*tier)->get(item.id, indices, out);
  }
  return 0;
}
