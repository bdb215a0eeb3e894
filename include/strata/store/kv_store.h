// AttentionStore (CachedAttention, ATC'24): the KV of finished conversation turns, kept in host
// DRAM and on SSD so the next turn loads it instead of recomputing its history.
//
// Data model. An *item* is all stored KV of one conversation: a list of *chunks*, chunk i holding
// one token block (block_size_tokens positions) of every layer, K and V, keys before RoPE:
//   chunk bytes = num_layers x [2 (K, V), num_kv_heads, block_size_tokens, head_dim] in the pool's
//   format, i.e. num_layers consecutive pool blocks (the executor defines and fills the bytes; the
//   store treats them as opaque).
// Chunk i of an exact item is named by the chained content hash of the conversation's tokens up
// to block i (kv/prefix_hash.h), so a stateless client resending the history finds it; an item
// saved for a session is also found by its session key. An item made from truncated history is
// not what recomputing its tokens gives, so it is found by session only: with token_offset d > 0,
// d conversation tokens after the first block were dropped, so chunk 0 holds tokens [0, B) and
// chunk i >= 1 tokens [i*B + d, (i+1)*B + d), re-rotated to positions [i*B, (i+1)*B).
//
// Tiers: DRAM slots in one arena (pinned through StoreOptions::register_host_memory when the
// device is a GPU) and the SsdTier. Items are saved into DRAM; I/O threads keep a share of DRAM
// free by demoting items to SSD (and dropping SSD copies when the disk is full), prefetch SSD items
// of queued jobs into DRAM, and expire items unused for `ttl`; placement_policy.h decides which.
// The GPU tier is the engine's prefix cache and is not managed here.
//
// Thread-safe. Loads pin an item (lease) so it cannot move or vanish while its chunks are read.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/kv/kv_types.h"
#include "strata/store/placement_policy.h"

namespace strata::store {

class SsdTier;

struct StoreOptions {
  int64_t chunk_bytes = 0;         // bytes of one chunk (see the data model)
  int32_t block_size_tokens = 16;  // tokens per chunk
  int64_t dram_bytes = 0;          // DRAM tier capacity
  std::string ssd_dir;             // empty: no SSD tier
  int64_t ssd_bytes = 0;
  int64_t ssd_file_bytes = int64_t{1} << 30;
  bool direct_io = true;
  // Identifies the model, weights and chunk layout; an SSD tier written under another tag is
  // discarded at open.
  uint64_t layout_tag = 0;
  EvictionPolicy policy = EvictionPolicy::kSchedulerAware;
  // Share of DRAM the I/O threads keep free for saves and prefetches (the paper's host buffer).
  double dram_reserve_fraction = 0.1;
  int32_t io_threads = 2;
  std::chrono::seconds ttl{3600};  // items unused this long leave the store; 0: never
  // Called once with the DRAM arena (e.g. cudaHostRegister for fast device copies); optional.
  std::function<void(void* data, size_t bytes)> register_host_memory;
  std::function<void(void* data)> unregister_host_memory;

  // INVALID_ARGUMENT naming store.<key>.
  Status validate() const;
};

enum class Tier { kDram, kSsd };
const char* tier_name(Tier tier);

struct TierCounters {
  int64_t hits = 0;       // loads served from this tier
  int64_t misses = 0;     // lookups this tier could not serve
  int64_t bytes_in = 0;   // written into the tier (saves, prefetches, demotions)
  int64_t bytes_out = 0;  // read out of the tier (loads, demotions)
  int64_t evictions = 0;  // items moved out of the tier
  double load_seconds = 0;  // total time of loads out of this tier
  int64_t loads = 0;
  double save_seconds = 0;  // total time of writes into this tier
  int64_t saves = 0;
};

struct StoreStats {
  TierCounters dram;
  TierCounters ssd;
  int64_t items = 0;
  int64_t dram_chunks_used = 0;
  int64_t dram_chunks_total = 0;
  int64_t ssd_chunks_used = 0;
  int64_t ssd_chunks_total = 0;
  int64_t prefetches = 0;         // items fetched SSD -> DRAM ahead of their job
  int64_t corrupt_chunks = 0;     // failed checksum or I/O on read: the item was dropped
  int64_t saves_skipped = 0;      // no DRAM room at save time
  int64_t saves_partial = 0;      // room for the leading chunks only: those were saved
  int64_t expired = 0;            // dropped by TTL
  bool ssd_available = false;     // false without an SSD tier or after it failed
};

// A stored prefix of a prompt.
struct StoreMatch {
  ItemId item = 0;
  int64_t num_chunks = 0;    // leading chunks of the item that match
  int64_t token_offset = 0;  // conversation tokens dropped after its first chunk (truncation)
  bool exact = true;
  Tier tier = Tier::kDram;   // where its first missing chunk is now (DRAM if all are there)
};

// Chunks pinned for one load; release with KvStore::release().
struct StoreLease {
  ItemId item = 0;
  std::vector<const std::byte*> chunks;  // requested chunks, in order, valid until release
  Tier served_from = Tier::kDram;        // kSsd if any chunk had to be read from disk now
};

// DRAM destinations for the chunks of one save; hand back with commit_save or abort_save.
struct SaveTicket {
  ItemId item = 0;
  int64_t first_chunk = 0;                // chunks before it are already stored
  std::vector<std::byte*> destinations;   // chunk first_chunk + i goes to destinations[i]
};

struct SaveRequest {
  std::string session;               // empty: content-addressed only
  bool exact = true;
  int64_t token_offset = 0;          // tokens the sequence dropped after its first block
  std::vector<kv::ChunkHash> chain;  // hashes of every full block of the sequence, in order
};

class KvStore {
 public:
  // Opens the tiers and recovers the SSD index. A missing or full disk leaves a DRAM-only store
  // (with a warning), not an error; bad options are INVALID_ARGUMENT.
  static StatusOr<std::unique_ptr<KvStore>> open(const StoreOptions& options);
  // Stops the I/O threads after writing DRAM-only items to SSD while it has free slots, so a
  // clean restart finds them.
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const StoreOptions& options() const { return options_; }

  // The longest stored prefix of `prompt`: the session's item if `session` names one whose
  // chunks match prompt with its token_offset tokens after the first block left out, else by
  // content hash (chains from `root`). At most (prompt.size() - token_offset - 1) / block chunks
  // are matched, so one token is always left to compute. Counts a miss in every tier when nothing
  // matches.
  std::optional<StoreMatch> find(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                 const std::string& session);
  // Pins chunks [first, first + count) of `item` in DRAM, reading missing ones from SSD now (each
  // checked against its checksum). NOT_FOUND if the item is gone or shorter; DATA_LOSS if a chunk
  // is corrupt or unreadable (the item is dropped and counted).
  StatusOr<StoreLease> acquire(ItemId item, int64_t first, int64_t count);
  // Like acquire() for chunks that are all in DRAM now, counted as a DRAM hit; nullopt (nothing
  // counted) when the item is gone, being moved or shorter, or a chunk is only on SSD. Never
  // waits or reads the disk: pre-loading uses it.
  std::optional<StoreLease> try_acquire_in_dram(ItemId item, int64_t first, int64_t count);
  void release(const StoreLease& lease, double load_seconds);

  // Reserves DRAM for the chunks of `request.chain` not stored yet, extending the session's or
  // the matching content item when its chunks are a prefix of the chain, else a new item. With
  // room for only some of them (after dropping DRAM copies of items also on SSD), the leading
  // ones (counted); RESOURCE_EXHAUSTED (counted) when DRAM has no room at all now.
  StatusOr<SaveTicket> begin_save(const SaveRequest& request);
  // Reserves DRAM for `hashes`, the chunks that follow the ticket's, so that a save can grow with
  // the sequence it copies (the engine writes each block as it is computed). Appends as many
  // destinations as there is room for, leading ones first (fewer are counted as partial), and
  // returns how many. A ticket without destinations extends its item only while nothing else is
  // changing it and it still ends where the ticket does; otherwise, or if the item is gone, 0.
  int64_t extend_save(SaveTicket* ticket, std::span<const kv::ChunkHash> hashes);
  // Publishes the ticket's chunks once `wait` (if set) returns: their bytes are written then.
  // With `wait` the publication happens on an I/O thread and the caller is never blocked.
  // `write_seconds`: the caller's time copying the bytes (the DRAM tier's save time, to which the
  // time `wait` blocks is added).
  void commit_save(SaveTicket ticket, std::function<void()> wait, double write_seconds);
  void abort_save(const SaveTicket& ticket);

  // The items the waiting jobs will load, head first: drives prefetching and eviction.
  void set_queue(std::vector<ItemId> queue);
  // Drops the session's item; false if there is none.
  bool erase_session(const std::string& session);
  // Blocks until no prefetch, demotion or pending save is possible right now (tests, benches).
  void wait_idle();

  StoreStats stats() const;
  // Saves published so far: a lookup that found nothing may find something once it changes.
  int64_t num_publications() const { return publications_.load(std::memory_order_relaxed); }

 private:
  struct Chunk {
    kv::ChunkHash hash;
    int32_t dram_slot = -1;
    int64_t ssd_slot = -1;
    uint64_t checksum = 0;  // valid with ssd_slot
  };
  struct Item {
    ItemId id = 0;
    std::string session;
    bool exact = true;
    int64_t token_offset = 0;
    std::vector<Chunk> chunks;  // published chunks
    int64_t dram_chunks = 0;    // of those, with a DRAM slot
    int64_t ssd_chunks = 0;     // ... with an SSD slot
    std::vector<kv::ChunkHash> pending;  // hashes of chunks a save reserved, not yet published
    int32_t pins = 0;
    bool busy = false;    // an I/O thread is moving it
    bool doomed = false;  // dropped while pinned: unreachable, removed at the last release
    uint64_t last_access = 0;
    uint64_t stored_at = 0;
    std::chrono::steady_clock::time_point touched;
  };
  enum class Action { kNone, kPrefetch, kDemote };
  struct PendingCommit {
    SaveTicket ticket;
    std::function<void()> wait;
    double write_seconds = 0;
  };

  explicit KvStore(const StoreOptions& options);
  Status start();
  void io_loop();
  // The next background action (REQUIRES mutex_); with `claim`, marks its item busy.
  Action next_action(ItemId* item, bool claim);
  void prefetch(ItemId id);  // REQUIRES the item is busy and mutex_ is not held
  // Reads chunks [first, first + count) of a busy item that are only on SSD into free DRAM slots
  // (REQUIRES enough; `lock` holds mutex_ and is released during the I/O), checking checksums.
  // Clears busy; on a bad chunk drops the item, counts it and returns DATA_LOSS.
  Status fetch_from_ssd(ItemId id, int64_t first, int64_t count, std::unique_lock<std::mutex>& lock);
  void demote(ItemId id);    // likewise
  void expire_items();
  // Drops victims' SSD copies until n slots are free; false if every candidate is exempt.
  bool make_ssd_room(int64_t n, ItemId exclude);
  // Frees DRAM by dropping the DRAM copies of items fully on SSD (no I/O) until n slots are free;
  // false if that is not enough.
  bool reclaim_clean_dram(int64_t n);
  // Removes an item from the store (every tier and index); a pinned one becomes unreachable at
  // once and leaves at its last release.
  void drop_item(ItemId id);
  // Removes an item's SSD copy; the item leaves the store if that was all of it.
  void drop_ssd_copy(ItemId id);
  // Writes chunks lacking an SSD copy to SSD (REQUIRES busy, mutex_ held via `lock`, which is
  // released during the I/O); false if the SSD has no room or failed.
  bool write_to_ssd(ItemId id, std::unique_lock<std::mutex>& lock);
  void publish(const SaveTicket& ticket, double write_seconds);  // REQUIRES mutex_
  std::vector<ItemView> views() const;
  int64_t dram_slots_total() const { return arena_bytes_ / slot_bytes_; }
  int64_t free_dram_slots() const { return static_cast<int64_t>(free_dram_.size()); }
  std::byte* dram(int32_t slot) const { return arena_ + static_cast<int64_t>(slot) * slot_bytes_; }
  int32_t slot_of(const std::byte* p) const { return static_cast<int32_t>((p - arena_) / slot_bytes_); }
  void touch(Item& item) { item.last_access = ++clock_; item.touched = std::chrono::steady_clock::now(); }
  double mean_item_chunks() const;
  // Adds to the published chunks and items mean_item_chunks() averages (REQUIRES mutex_).
  void count_chunks(int64_t chunks, int64_t items);
  int64_t eviction_window() const;
  int64_t prefetch_window() const;
  bool ssd_usable() const { return ssd_ != nullptr && !ssd_failed_; }

  StoreOptions options_;
  int64_t slot_bytes_ = 0;
  std::byte* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  std::unique_ptr<SsdTier> ssd_;
  bool ssd_failed_ = false;

  mutable std::mutex mutex_;
  std::condition_variable work_;  // background work may be possible
  std::condition_variable idle_;  // an item stopped being busy / an action finished
  std::vector<int32_t> free_dram_;
  std::unordered_map<ItemId, Item> items_;
  std::unordered_map<kv::ChunkHash, std::pair<ItemId, int32_t>> by_hash_;  // exact items only
  std::unordered_map<std::string, ItemId> by_session_;
  std::vector<ItemId> queue_;
  ItemId next_item_ = 1;
  int64_t published_chunks_ = 0;  // chunks of all items
  int64_t published_items_ = 0;   // items with at least one chunk
  uint64_t clock_ = 0;
  std::chrono::steady_clock::time_point last_expiry_scan_;
  int32_t active_actions_ = 0;
  int64_t dram_slots_demoting_ = 0;  // DRAM slots that demotions in flight will free
  std::vector<PendingCommit> commits_;
  std::atomic<int64_t> publications_ = 0;
  bool stopping_ = false;
  StoreStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace strata::store
