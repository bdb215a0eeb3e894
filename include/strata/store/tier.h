// One level of the KV store's tier stack (store/kv_store.h): a place that holds the values of
// stored chunks, any size each. The store orders tiers nearest first as the config lists them:
// host DRAM (always first: the device copies to and from it), then SSD, then any other tier.
// Adding a tier is implementing this interface and naming it in the config; the engine and the
// scheduler never see tiers.
//
// Values. A chunk's value is its bytes after the tier's codec (store/codec.h): the raw chunk
// (identity), or fewer bytes (zstd). A tier stores values of one item together and forgets them
// together (evict), as the store places whole items.
//
// Two-phase put: reserve() takes room for values of given sizes (cheap, under the store's lock),
// put() writes them and makes them findable (blocking I/O, on the store's I/O threads, without
// its lock), or cancel() gives the room back. get() reads values back, checking what the tier
// checks (checksums on SSD). Each tier synchronises its own index and allocator: calls may come
// from any thread. The store's I/O threads make every call asynchronous to the step loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"
#include "strata/kv/krul_policy.h"
#include "strata/kv/kv_types.h"
#include "strata/store/codec.h"
#include "strata/store/extent_allocator.h"
#include "strata/store/placement_policy.h"

namespace strata::store {

inline constexpr int64_t kIoAlignment = 4096;
inline int64_t round_up_to_page(int64_t bytes) {
  return (bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
}

// Where one value lives in its tier: extents of kIoAlignment-byte pages (a tier with other
// addressing leaves them empty), and the value's size.
struct Placement {
  std::vector<Extent> extents;
  int64_t bytes = 0;
};

// Room for one put: placements[i] receives value i.
struct Reservation {
  std::vector<Placement> placements;
};

// The attributes a tier keeps with an item's values (so a persistent tier can rebuild the item).
struct ItemRecord {
  std::string session;       // empty: found by content hash only
  bool exact = true;         // KV equals recomputing its tokens (indexed by content hash)
  int64_t token_offset = 0;  // conversation tokens dropped after chunk 0 (truncation)
  std::string codec;         // the item's lossy codec (store/item_codecs.h); empty: none
  // Chunks a token-dropping codec removed after chunk 0 since the chunks' hashes were made:
  // chunk i >= 1 carries the hash of link i + skipped_chunks of its conversation's chain.
  int64_t skipped_chunks = 0;
  // The task family of the requests that stored it (AdaptCache's quality profile); empty: the
  // profile's default quality.
  std::string task;
  // Krul's layer pairs of its conversation, chosen at its last turn's end (what the layer-merge
  // codec merges); empty: none chosen.
  std::vector<kv::krul::LayerPair> layer_pairs;
  // Its leading chunks that are only valid together (H2O chose their tokens over all of them): a
  // match must cover them all; 0: any leading chunks.
  int64_t whole_chunks = 0;
};

// A stored chunk: chunk `index` of `item`, with its content hash. A raw chunk below DRAM may hold
// only its layers [first_layer, chunk_layers) (Krul's stored suffix: its value is those layers'
// bytes, the chunk's tail); 0: every layer (StoreOptions::chunk_layers, docs/krul.md).
struct ChunkKey {
  ItemId item = 0;
  int32_t index = 0;
  kv::ChunkHash hash;
  int32_t first_layer = 0;
};

// An item a persistent tier held when it opened, or a shared tier found: chunks 0..n-1 in order.
struct RecoveredItem {
  ItemId id = 0;
  ItemRecord attributes;
  std::vector<ChunkKey> chunks;
};

// Memory aligned to kIoAlignment, capacity rounded up to it (direct I/O reads and writes whole
// pages): values come back from get() in these.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  std::byte* data() const { return data_.get(); }
  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  // REQUIRES bytes <= capacity().
  void resize(int64_t bytes);
  std::span<const std::byte> bytes() const { return {data_.get(), static_cast<size_t>(size_)}; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
};

class Tier {
 public:
  virtual ~Tier() = default;

  virtual const std::string& name() const = 0;  // "dram", "ssd", ...: metrics and usage name it
  virtual CodecKind codec() const = 0;          // how its values are encoded
  virtual int64_t capacity_bytes() const = 0;
  virtual int64_t used_bytes() const = 0;  // reserved or holding values
  // Bytes a value of `bytes` bytes takes here (page rounding).
  virtual int64_t footprint(int64_t bytes) const = 0;
  // False once the tier failed (an I/O error): it takes nothing more and serves nothing.
  virtual bool available() const = 0;
  // What /metrics reports as the tier's availability: available() for a tier that fails for
  // good; false from a failed call to the next good one for a tier that retries (remote).
  virtual bool healthy() const { return available(); }

  // Room for values of `sizes` bytes, or nullopt (nothing taken) without enough free room.
  virtual std::optional<Reservation> reserve(std::span<const int64_t> sizes) = 0;
  virtual void cancel(const Reservation& reservation) = 0;
  // Writes values[i] (reservation.placements[i].bytes each, readable up to their footprint and
  // kIoAlignment-aligned) and makes them findable under keys[i], durably in a persistent tier.
  // Keys of one item. On error nothing is findable, the room is given back, and the tier may
  // have failed (available()).
  virtual Status put(const ItemRecord& item, const Reservation& reservation,
                     std::span<const ChunkKey> keys,
                     std::span<const std::span<const std::byte>> values) = 0;
  // Reads the values of chunks `indices` of `item` into out[i]. NOT_FOUND if one is not held;
  // DATA_LOSS if one fails its checksum; UNAVAILABLE if the tier failed.
  virtual Status get(ItemId item, std::span<const int32_t> indices,
                     std::span<AlignedBuffer> out) const = 0;
  // Whether get_part() reads parts of values (raw values checked by segment: the SSD tier).
  virtual bool reads_parts() const { return false; }
  // Reads bytes [offset, offset + bytes) of the value of chunk `index` of `item` into `out`,
  // checked against the checksums of the segments they cover (read whole for that). Errors as
  // get(), and INVALID_ARGUMENT for bytes outside the value. Only where reads_parts().
  virtual Status get_part(ItemId item, int32_t index, int64_t offset, int64_t bytes,
                          std::byte* out) const {
    (void)item, (void)index, (void)offset, (void)bytes, (void)out;
    return unimplemented_error(name() + " tier reads whole values only");
  }
  virtual bool contains(const ChunkKey& key) const = 0;
  // Forgets every value of `item` and frees their room (durably first in a persistent tier).
  virtual Status evict(ItemId item) = 0;
  // Failures by reason since the tier opened (metrics: why it is unavailable or refused values).
  virtual std::map<std::string, int64_t> failures() const { return {}; }
};

// A tier other processes share (a Redis server that several replicas use): it may hold what
// another process stored, which this process has not indexed. The store writes every published
// item through to it, and asks it for a prompt's session and content before the request is
// admitted (KvStore::look_up_shared). Its values are found by content (exact items under their
// chained hashes, which the model, page format, block size and tenant root) or by session.
class SharedTier : public Tier {
 public:
  // The latest item stored for `session`: its attributes and chunk hashes (chunks 0..n-1, with
  // `item` unset), or nullopt. UNAVAILABLE when the tier cannot answer.
  virtual StatusOr<std::optional<RecoveredItem>> find_session(const std::string& session) = 0;
  // How many leading hashes of `chain` name chunks of exact items without a lossy codec that the
  // tier holds.
  virtual StatusOr<int64_t> count_held(std::span<const kv::ChunkHash> chain) = 0;
  // Indexes chunks found above under found.id (each key's item set to it), so get() reads them.
  virtual void attach(const RecoveredItem& found) = 0;
  // Deletes the session's record, so no process finds the conversation by session any more.
  virtual Status erase_session(const std::string& session) = 0;
};

}  // namespace strata::store
