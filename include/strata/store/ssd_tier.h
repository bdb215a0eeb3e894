// A tier on a local SSD: a few large preallocated data files cut into kIoAlignment pages, an
// extent allocator over them (a value takes the pages it needs, in as few extents as it can),
// direct I/O where the file system allows it, and an append-only journal that is the tier's
// index. All file access goes through an Env (store/env.h).
//
// Files under `dir`:
//   data-NNN.bin   file_bytes each, preallocated (a full disk shows at open)
//   index.journal  records, each [u32 sync word][u32 payload bytes][u32 type][payload][u64 XXH3-64
//                  of size, type and payload]: a header (magic, version, page size, file size,
//                  layout tag, codec; written twice), then PUT (one value is durable: its item,
//                  chunk, hash, size, checksums, extents and the item's attributes) and DROP (an
//                  item's values are gone) records.
// Crash safety: data is written and synced before its PUT is appended (and synced), and a DROP is
// synced before its pages are reused. Replay skips a torn or corrupt record to the next sync word
// that starts a whole record, keeping every good record; a page two surviving PUTs name (their
// DROP was lost) belongs to the later one; pages no surviving PUT names are free again. get()
// checks every value against its checksums (one per segment: SsdOptions::segment_bytes), and
// get_part() the segments it reads, so a torn data write is never served. A failed write, sync or
// journal append fails the tier (available() turns false): the store goes on without it.
#pragma once

#include <map>
#include <mutex>
#include <unordered_map>

#include "strata/store/env.h"
#include "strata/store/tier.h"

namespace strata::store {

struct SsdOptions {
  std::string name = "ssd";
  std::string dir;
  int64_t capacity_bytes = 0;
  int64_t file_bytes = int64_t{1} << 30;  // rounded down to whole pages
  uint64_t layout_tag = 0;  // model fingerprint and chunk geometry: a mismatch starts empty
  bool direct_io = true;
  CodecKind codec = CodecKind::kIdentity;
  Env* env = Env::posix();
  // Values get a checksum per segment of at most this many bytes (equal segments, the last one
  // shorter), so that get_part() reads and checks only the segments a part covers (the store sets
  // it to a chunk layer's bytes for a tier without a codec); 0: one checksum per value.
  int64_t segment_bytes = 0;
  // Bytes per second the tier's files move at most, reads and writes together (throttled_env
  // over `env`; an emulated slower disk for measurements); 0: as fast as the disk.
  int64_t bandwidth_limit = 0;
  // A deployment's explicitly configured tier: KvStore::open fails when it cannot be used, instead
  // of going on without it.
  bool required = false;
};

class SsdTier final : public Tier {
 public:
  // Creates or reopens the tier, replaying the journal into `recovered` and compacting it.
  // RESOURCE_EXHAUSTED when not even one data file fits on the disk; other errors name the path.
  static StatusOr<std::unique_ptr<SsdTier>> open(const SsdOptions& options,
                                                 std::vector<RecoveredItem>* recovered);
  ~SsdTier() override;
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  const std::string& name() const override { return options_.name; }
  CodecKind codec() const override { return options_.codec; }
  int64_t capacity_bytes() const override;
  int64_t used_bytes() const override;
  int64_t footprint(int64_t bytes) const override { return round_up_to_page(bytes); }
  bool available() const override;
  std::optional<Reservation> reserve(std::span<const int64_t> sizes) override;
  void cancel(const Reservation& reservation) override;
  Status put(const ItemRecord& item, const Reservation& reservation, std::span<const ChunkKey> keys,
             std::span<const std::span<const std::byte>> values) override;
  Status get(ItemId item, std::span<const int32_t> indices,
             std::span<AlignedBuffer> out) const override;
  bool reads_parts() const override { return options_.codec == CodecKind::kIdentity; }
  Status get_part(ItemId item, int32_t index, int64_t offset, int64_t bytes,
                  std::byte* out) const override;
  bool contains(const ChunkKey& key) const override;
  Status evict(ItemId item) override;

  bool direct_io() const { return direct_io_; }

 private:
  struct Value {
    kv::ChunkHash hash;
    Placement placement;
    std::vector<uint64_t> checksums;  // one per segment, in order (SsdOptions::segment_bytes)
  };
  explicit SsdTier(const SsdOptions& options, std::vector<Extent> regions);
  Status recover(std::vector<RecoveredItem>* recovered);
  StatusOr<Value> find(ItemId item, int32_t index) const;  // NOT_FOUND, or UNAVAILABLE if failed
  // Reads pages [first, first + count) of a value into `out` (aligned); fails the tier on error.
  Status read_pages(const Placement& placement, int64_t first, int64_t count, std::byte* out) const;
  Status append(std::span<const std::byte> records);  // REQUIRES mutex_ not held
  Status fail(Status status) const;                   // marks the tier failed, returns status
  std::string data_path(int64_t file) const;
  std::string journal_path() const;

  std::unique_ptr<Env> throttled_env_;  // options_.env when bandwidth_limit is set
  SsdOptions options_;
  int64_t pages_per_file_ = 0;
  std::vector<std::unique_ptr<File>> files_;
  bool direct_io_ = true;
  std::mutex journal_mutex_;  // appends come from several I/O threads
  std::unique_ptr<File> journal_;
  mutable std::mutex mutex_;  // allocator_, values_, failed_
  ExtentAllocator allocator_;
  std::unordered_map<ItemId, std::map<int32_t, Value>> values_;
  mutable bool failed_ = false;
};

}  // namespace strata::store
