// The store's SSD tier: a few large preallocated data files cut into fixed-size slots (one chunk
// each, a multiple of 4 KiB), an extent allocator over them, direct I/O (O_DIRECT, falling back to
// buffered I/O on file systems without it), and an append-only journal that is the tier's index.
//
// Files under `dir`:
//   data-NNN.bin   file_bytes each, preallocated with posix_fallocate (a full disk shows at open)
//   index.journal  records, each [u32 payload bytes][u32 type][payload][u64 XXH3-64 of payload]:
//                  a header (magic, version, layout, model fingerprint), then PUT (one chunk of an
//                  item is durable in a slot) and DROP (an item's SSD copy is gone) records.
// Crash safety: data is written and fdatasync'ed before its PUT is appended (and synced), and a DROP
// is synced before its slots are reused. Replay stops at the first torn or corrupt record; slots
// no surviving PUT names are free again. A chunk whose data does not match its recorded checksum
// is caught when it is read (the store verifies every read), so a torn data write is never served.
//
// Thread-safety: allocate()/free() are serialised by the store; read()/write() of disjoint slots
// and the journal appends may run concurrently on I/O threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/common/status.h"
#include "strata/kv/kv_types.h"
#include "strata/store/extent_allocator.h"
#include "strata/store/placement_policy.h"

namespace strata::store {

inline constexpr int64_t kIoAlignment = 4096;

struct SsdOptions {
  std::string dir;
  int64_t capacity_bytes = 0;
  int64_t file_bytes = int64_t{1} << 30;
  int64_t slot_bytes = 0;   // chunk bytes rounded up to kIoAlignment
  uint64_t layout_tag = 0;  // model fingerprint and chunk geometry: a mismatch starts empty
  bool direct_io = true;
};

// One chunk's durable record.
struct ChunkRecord {
  ItemId item = 0;
  int32_t chunk_index = 0;
  kv::ChunkHash hash;
  int64_t slot = 0;
  uint64_t checksum = 0;
};

// Per-item attributes written with every PUT (so any surviving record describes its item).
struct ItemRecord {
  std::string session;       // empty: found by content hash only
  bool exact = true;         // KV equals recomputing its tokens (indexed by content hash)
  int64_t token_offset = 0;  // conversation tokens dropped after chunk 0 (truncation)
};

struct RecoveredItem {
  ItemId id = 0;
  ItemRecord attributes;
  std::vector<ChunkRecord> chunks;  // chunk_index 0..n-1 in order
};

class SsdTier {
 public:
  // Creates or reopens the tier, replaying the journal into `recovered` and compacting it.
  // RESOURCE_EXHAUSTED when not even one data file fits on the disk; other errors name the path.
  static StatusOr<std::unique_ptr<SsdTier>> open(const SsdOptions& options,
                                                 std::vector<RecoveredItem>* recovered);
  ~SsdTier();
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  int64_t num_slots() const { return allocator_.num_slots(); }
  int64_t num_free_slots() const { return allocator_.num_free(); }
  int64_t slot_bytes() const { return options_.slot_bytes; }
  bool direct_io() const { return direct_io_; }

  // n slots (in extents, expanded in order), or nullopt.
  std::optional<std::vector<int64_t>> allocate(int64_t n);
  void free(std::span<const int64_t> slots);

  // Writes buffers[i] (slot_bytes, kIoAlignment-aligned) to slots[i], coalescing consecutive
  // slots into one pwritev, then fdatasync. Thread-safe for disjoint slots.
  Status write(std::span<const int64_t> slots, std::span<const std::byte* const> buffers) const;
  Status read(std::span<const int64_t> slots, std::span<std::byte* const> buffers) const;

  // Journal appends (synced before returning).
  Status journal_put(const ItemRecord& item, std::span<const ChunkRecord> chunks);
  Status journal_drop(ItemId item);

 private:
  explicit SsdTier(const SsdOptions& options, std::vector<Extent> regions);
  Status recover(std::vector<RecoveredItem>* recovered);
  Status append(std::span<const std::byte> records);
  std::string data_path(int64_t file) const;
  std::string journal_path() const;

  SsdOptions options_;
  ExtentAllocator allocator_;
  int64_t slots_per_file_ = 0;
  std::vector<int> fds_;
  std::mutex journal_mutex_;  // appends come from several I/O threads
  int journal_fd_ = -1;
  bool direct_io_ = true;
};

}  // namespace strata::store
