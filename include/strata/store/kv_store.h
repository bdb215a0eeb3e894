// AttentionStore (CachedAttention, ATC'24): the KV of finished conversation turns, kept in a stack
// of tiers (host DRAM, SSD, ...) so the next turn loads it instead of recomputing its history.
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
// A token-dropping codec (StreamingLLM) drops s middle chunks of an item: d grows by s*B and the
// kept chunks keep their hashes, so chunk i >= 1 carries link i + s of the chain its hashes were
// made on (skipped_chunks). An item whose hashes were made from position 0 (d == s*B) stays
// findable by content: the prompt's chain matches its kept chunks at their links. H2O's codecs
// drop chunks the same way but fill the kept ones with tokens chosen over the whole item, so its
// leading whole_chunks are valid only together: a match must cover them all. Krul's stored
// suffix: a raw or layer-merged chunk may keep only what its layers [first_layer, chunk_layers)
// are restored from below DRAM (the layers a restoration loads rather than recomputes;
// set_stored_layers); read back, the bytes before it are zeros, and a load of it must leave its
// other layers unread.
//
// Tiers (store/tier.h): host DRAM first (DramTier: loads are read and saves written there by the
// device), then the tiers StoreOptions::tiers lists, nearest first (SsdTier; a remote tier
// later). Items are saved into DRAM; I/O threads keep a share of DRAM free by demoting items to
// every lower tier that takes them (the lower tiers are inclusive: each keeps its own copy and
// evicts by the policy when full), prefetch items of queued jobs from the nearest lower tier
// holding them into DRAM, and expire items unused for `ttl`; placement_policy.h decides which.
// A lower tier's values are encoded by its codec (identity or zstd) and decoded on the way up.
// An item's chunks may also take a lossy codec (store/item_codecs.h: KIVI), applied in DRAM by
// the I/O threads, for a fixed codec or by AdaptCache's utility greedy; loads hand encoded chunks
// to the device with their codec.
// A load whose chunks DRAM has no room for reads them from the lower tier into buffers the lease
// owns, straight for the device. The GPU tier is the engine's prefix cache and is not managed
// here.
//
// Thread-safe. Loads pin an item (lease) so it cannot move or vanish while its chunks are read.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
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
#include "strata/kv/kv_format.h"
#include "strata/kv/kv_types.h"
#include "strata/store/adaptcache_policy.h"
#include "strata/store/dram_tier.h"
#include "strata/store/item_codecs.h"
#include "strata/store/placement_policy.h"
#include "strata/store/redis_tier.h"
#include "strata/store/ssd_tier.h"
#include "strata/store/store_config.h"
#include "strata/store/store_followers.h"

namespace strata::store {

struct StoreOptions {
  int64_t chunk_bytes = 0;         // bytes of one chunk (see the data model)
  int32_t block_size_tokens = 16;  // tokens per chunk
  // Layers a raw chunk holds, each chunk_bytes / chunk_layers bytes (see the data model): what
  // read_layers() reads one range at a time, and the SSD tiers' checksum segments.
  int32_t chunk_layers = 1;
  int64_t dram_bytes = 0;          // DRAM tier capacity
  // The tiers below DRAM, nearest first, each with its name, directory, capacity, codec and Env;
  // the store sets their layout_tag. A tier that cannot open is left out with a warning, or fails
  // open() if it is `required` (a deployment's configured tier).
  std::vector<SsdOptions> tiers;
  // A tier shared with other replicas (a Redis server), below every other tier; the store sets
  // its layout_tag. A server that is down at open makes it unavailable until it answers.
  std::optional<RedisOptions> remote;
  // Identifies the model, weights and chunk layout; a persistent tier written under another tag
  // is discarded at open.
  uint64_t layout_tag = 0;
  EvictionPolicy policy = EvictionPolicy::kSchedulerAware;
  // Share of DRAM the I/O threads keep free for saves and prefetches (the paper's host buffer).
  double dram_reserve_fraction = 0.1;
  int32_t io_threads = 2;
  std::chrono::seconds ttl{3600};  // items unused this long leave the store; 0: never
  // Called once with the DRAM arena (e.g. cudaHostRegister for fast device copies); optional.
  std::function<void(void* data, size_t bytes)> register_host_memory;
  std::function<void(void* data)> unregister_host_memory;
  // The codecs an item may take: codecs[0] is "none" (set by open() from chunk_bytes), then the
  // lossy ones, which need `transcode`. fixed_codec > 0: every item takes that one (the static
  // baselines); adaptcache.enabled: each item's codec and tier by utility.
  std::vector<ItemCodec> codecs;
  Transcode transcode;
  KeepHeavyHitters keep_heavy_hitters;  // needed by a heavy_hitters codec
  int32_t fixed_codec = 0;
  AdaptCacheOptions adaptcache;

  // INVALID_ARGUMENT naming store.<key>.
  Status validate() const;
  // The options a deployment's kv_store section describes: its DRAM tier, an "ssd" tier below it
  // when ssd_dir is set, its policy, I/O threads, TTL and reserve. The caller sets chunk_bytes,
  // block_size_tokens, layout_tag and the host-memory hooks.
  static StoreOptions from_config(const StoreConfig& config);
};

// Index of a tier in the stack: 0 is DRAM, then StoreOptions::tiers in order.
using TierIndex = int32_t;
inline constexpr TierIndex kDramTier = 0;
inline constexpr int kMaxTiers = 8;

struct TierCounters {
  int64_t hits = 0;       // loads served from this tier
  int64_t misses = 0;     // lookups this tier could not serve
  int64_t bytes_in = 0;   // written into the tier (saves, prefetches, demotions), as stored
  int64_t bytes_out = 0;  // read out of the tier (loads, demotions), as stored
  int64_t evictions = 0;  // items moved out of the tier
  double load_seconds = 0;  // total time of loads out of this tier
  int64_t loads = 0;
  double save_seconds = 0;  // total time of writes into this tier
  int64_t saves = 0;
};

struct TierStats : TierCounters {
  std::string name;
  std::string codec;
  int64_t chunks = 0;          // chunks held
  int64_t used_bytes = 0;      // held or reserved
  int64_t capacity_bytes = 0;
  int64_t raw_bytes = 0;       // what the chunks it holds are before their codec
  bool available = true;       // Tier::healthy(): false after the tier failed
  std::map<std::string, int64_t> failures;  // Tier::failures(): why it refused or was unavailable
};

struct StoreStats {
  std::vector<TierStats> tiers;  // DRAM first, then the lower tiers in order
  int64_t items = 0;
  int64_t prefetches = 0;         // items fetched into DRAM ahead of their job
  int64_t direct_loads = 0;       // loads read from a lower tier without DRAM room, for the device
  int64_t corrupt_chunks = 0;     // failed checksum or I/O on read: the item was dropped
  int64_t saves_skipped = 0;      // save attempts that found no DRAM room (asked again later)
  int64_t saves_partial = 0;      // reservations with room for the leading chunks only
  int64_t expired = 0;            // dropped by TTL
  int64_t transcodes = 0;         // items re-encoded to another codec
  int64_t shared_lookups = 0;     // prompts looked up in the shared tier before admission
  int64_t shared_found = 0;       // of those, found longer there than here: indexed and read
  std::vector<std::string> codec_names;   // StoreOptions::codecs' names, "none" first
  std::vector<int64_t> codec_items;       // items per codec, in that order
  std::vector<int64_t> codec_transcodes;  // re-encodings into each codec, in that order
  // The tier named `name`; an empty, unavailable one if the store has none (it failed to open).
  const TierStats& tier(std::string_view name) const;
};

// A stored prefix of a prompt.
struct StoreMatch {
  ItemId item = 0;
  int64_t num_chunks = 0;    // leading chunks of the item that match
  int64_t token_offset = 0;  // conversation tokens dropped after its first chunk (truncation)
  bool exact = true;
  // Of those, the chunks token dropping removed since its hashes were made (the data model).
  int64_t skipped_chunks = 0;
  TierIndex tier = kDramTier;  // the farthest tier a matched chunk must come from
  // The item's whole_chunks: a save of the sequence that loads them passes them on (SaveRequest).
  int64_t whole_chunks = 0;
};

// Chunks pinned for one load; release with KvStore::release().
struct StoreLease {
  ItemId item = 0;
  std::vector<const std::byte*> chunks;  // requested chunks, in order, valid until release
  TierIndex served_from = kDramTier;     // the farthest tier a chunk had to be read from now
  int32_t codec = 0;                     // how the chunks are encoded (StoreOptions::codecs)
  // The item's layer pairs when its codec merges them (ItemCodec::merged_pairs), else empty.
  std::vector<kv::krul::LayerPair> layer_pairs;
  // Chunks read without DRAM room, owned by the lease (chunks point into them): entry i for
  // requested chunk i, empty for those in DRAM.
  std::shared_ptr<std::vector<AlignedBuffer>> direct;
  // Per requested chunk, its first stored layer (ChunkKey::first_layer) when one is > 0, else
  // empty: the chunk's bytes of the layers before it are not its KV.
  std::vector<int32_t> first_layers;
};

// Raw or layer-merged chunks pinned to be read by layer ranges (KvStore::pin_layers): release
// `lease` with KvStore::release() when done. A merged chunk (lease.layer_pairs not empty) stays
// in its merged form: layers [b, e) are its bytes from KvStore::layer_offset(b) to
// layer_offset(e), and a pair's data lies at its deep layer's place.
struct LayeredLease {
  // chunks[i]: chunk first + i, in DRAM, or a buffer the lease owns that read_layers() fills.
  StoreLease lease;
  int64_t first = 0;
  // Per chunk, the tier read_layers() reads it from; kDramTier: whole already.
  std::vector<TierIndex> from;
};

// Layers [layer_begin, layer_end) of chunk `chunk` of a LayeredLease (an index into its chunks).
struct LayerPart {
  int64_t chunk = 0;
  int32_t layer_begin = 0;
  int32_t layer_end = 0;
};

// DRAM destinations for the chunks of one save; hand back with commit_save or abort_save.
struct SaveTicket {
  ItemId item = 0;
  int64_t first_chunk = 0;                // chunks before it are already stored
  std::vector<std::byte*> destinations;   // chunk first_chunk + i goes to destinations[i]
  Reservation reservation;                // the DRAM room behind the destinations
  bool continued = false;                 // continue_save's: its item is not re-encoded meanwhile
};

struct SaveRequest {
  std::string session;               // empty: content-addressed only
  bool exact = true;
  int64_t token_offset = 0;          // tokens the sequence dropped after its first block
  // Hashes of every full block of the sequence, in order: chain[i >= 1] is link i +
  // skipped_chunks of the chain its hashes continue (a sequence that resumed a token-dropped
  // item hashes its blocks on from that item's links, so its item is found by content too).
  std::vector<kv::ChunkHash> chain;
  int64_t skipped_chunks = 0;
  int32_t task = 0;  // the request's task family (AdaptCacheOptions::task_index)
  // Leading chunks that are only valid together (the sequence restored them from an H2O item:
  // StoreMatch::whole_chunks): a match must cover them all.
  int64_t whole_chunks = 0;
};

// Names the layout of stored chunks (StoreOptions::layout_tag): chunks are interchangeable only
// between engines of one model (`model_fingerprint`: its content), pool format and geometry.
uint64_t layout_tag(uint64_t model_fingerprint, const kv::KvFormat& format,
                    int64_t block_size_tokens, int64_t chunk_bytes);

class KvStore {
 public:
  // Opens the tiers and recovers the persistent ones' items. A tier that cannot open (a missing
  // or full disk) is left out with a warning, unless it is required (FAILED_PRECONDITION naming
  // it); bad options are INVALID_ARGUMENT.
  static StatusOr<std::unique_ptr<KvStore>> open(const StoreOptions& options);
  // Stops the I/O threads after writing DRAM-only items to the lower tiers while they have room,
  // so a clean restart finds them.
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const StoreOptions& options() const { return options_; }
  // Where layer `layer`'s bytes begin in a chunk stored in `codec` (raw, or a layer merge of
  // `pairs`: LayeredLease); layer chunk_layers: the value's end.
  int64_t layer_offset(int32_t codec, std::span<const kv::krul::LayerPair> pairs,
                       int32_t layer) const;
  int num_tiers() const { return static_cast<int>(tiers_.size()); }
  const std::string& tier_name(TierIndex tier) const { return tiers_[tier]->name(); }

  // The longest stored prefix of `prompt`: the session's item if `session` names one whose
  // chunks match prompt with its token_offset tokens after the first block left out, else by
  // content hash (chains from `root`). At most (prompt.size() - token_offset - 1) / block chunks
  // are matched, so one token is always left to compute, and only chunks a load can read (none
  // held only by a failed tier). Counts a miss in every tier when nothing matches.
  std::optional<StoreMatch> find(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                 const std::string& session);
  // What find() would match now, without counting a lookup (a router asking which replica holds
  // a conversation).
  std::optional<StoreMatch> peek(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                 const std::string& session) const;
  // Asks the shared tier (one other replicas write: the remote tier) for `prompt` before its
  // request is admitted: when it holds a longer prefix than find() would match here (by session,
  // then by content), the item is indexed here and read into DRAM now, on the calling thread, so
  // that find() matches it and the load reads DRAM (its first load reports the shared tier). An
  // item find() matches here that only the shared tier holds (demoted out of DRAM) is read into
  // DRAM the same way. Network calls are bounded by the tier's timeout; a failure leaves the
  // store as it was (or drops the item whose chunks failed). Nothing without a usable shared
  // tier.
  void look_up_shared(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                      const std::string& session);
  // Pins chunks [first, first + count) of `item`, reading those DRAM lacks from the nearest lower
  // tier now (checked against their checksums and decoded): into DRAM, or, when DRAM has no room
  // for them, into buffers the lease owns. NOT_FOUND if the item is gone or shorter, or token
  // dropping changed the chunks asked for since it was matched with `skipped_chunks`
  // (StoreMatch's; chunk 0, the sinks, never changes); DATA_LOSS if a chunk is corrupt or
  // unreadable (the item is dropped and counted).
  StatusOr<StoreLease> acquire(ItemId item, int64_t first, int64_t count,
                               int64_t skipped_chunks = 0);
  // Like acquire() for raw chunks that are all in DRAM now, counted as a DRAM hit; nullopt
  // (nothing counted) when the item is gone, changed, being moved, encoded or shorter, or a chunk
  // is only in a lower tier.
  // Never waits or does I/O: pre-loading uses it.
  std::optional<StoreLease> try_acquire_in_dram(ItemId item, int64_t first, int64_t count,
                                                int64_t skipped_chunks = 0);
  // The farthest tier chunks [first, first + count) of `item` would be read from now (kDramTier:
  // all in DRAM, or fetched from the shared tier for this load), without reading or counting
  // anything; nullopt if the item is gone, shorter or changed since it was matched with
  // `skipped_chunks`. A restoration plans by the cost of reading from there. With `first_layers`,
  // also each chunk's first stored layer (ChunkKey::first_layer), which the plan must respect;
  // with `layer_pairs`, the pairs its chunks are merged by (empty: raw or another codec).
  std::optional<TierIndex> locate(ItemId item, int64_t first, int64_t count,
                                  int64_t skipped_chunks = 0,
                                  std::vector<int32_t>* first_layers = nullptr,
                                  std::vector<kv::krul::LayerPair>* layer_pairs = nullptr) const;
  void release(const StoreLease& lease, double load_seconds);
  // Tensor parallelism (store_followers.h): chunks [first, first + count) of `item`, named for the
  // other ranks' stores; nullopt if the item is gone or shorter. Call while they are pinned.
  std::optional<StoredRun> describe_run(ItemId item, int64_t first, int64_t count) const;
  // The hashes of the item's chunks [0, count) (fewer if it has fewer; none if it is gone).
  std::vector<kv::ChunkHash> chunk_hashes(ItemId item, int64_t count) const;
  // How many leading chunks of the item `run` names (from chunk 0; `hashes`: its chunks') this
  // store holds where a load can read them: the longest prefix find_run() finds.
  int64_t held_prefix(const StoredRun& run, std::span<const kv::ChunkHash> hashes) const;
  // This store's copy of `run`: the item of the run's session, else the one whose chunk carries
  // its last hash, when it has the run's shape and that hash at the run's last chunk.
  std::optional<ItemId> find_run(const StoredRun& run) const;
  // Pins find_run()'s item (acquire()): NOT_FOUND (counted as a miss) when there is none;
  // acquire()'s errors.
  StatusOr<StoreLease> acquire_run(const StoredRun& run);
  // Pins raw or layer-merged chunks [first, first + count) of `item` to be read by layer ranges
  // (LayeredLease), without reading
  // anything: chunks in DRAM are handed over whole, the others get buffers the lease owns that
  // read_layers() fills (Krul's reads beside the pass: each layer's part of the history just
  // before the layer that loads it). The read chunks are not copied into DRAM. Counted as
  // acquire() counts a hit. Errors as acquire(), and FAILED_PRECONDITION (nothing pinned or
  // counted) for an item in another codec: acquire() reads those whole.
  StatusOr<LayeredLease> pin_layers(ItemId item, int64_t first, int64_t count,
                                    int64_t skipped_chunks = 0);
  // Reads `parts` of the lease's chunks from their tiers into its buffers: a tier that reads parts
  // (Tier::reads_parts: the raw SSD tier) reads only those layers' bytes (of a merged chunk, its
  // bytes between the layers' places), checked by their checksums; another reads the whole chunk
  // the first time (its `from` turns kDramTier).
  // DATA_LOSS if a part is corrupt or unreadable: the item is dropped and counted, as acquire()
  // does. One thread at a time per lease.
  Status read_layers(LayeredLease* lease, std::span<const LayerPart> parts);

  // Reserves DRAM for the chunks of `request.chain` not stored yet, extending the session's or
  // the matching content item when its chunks are a prefix of the chain, else a new item. With
  // room for only some of them (after dropping DRAM copies of items held below), the leading
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
  // Publishes the ticket's chunks as commit_save does and returns the ticket the save goes on
  // with: no destinations yet (extend_save adds them), first_chunk after these. Until that ticket
  // is committed or aborted its item keeps its codec (a re-encoded item takes no raw chunks, which
  // would end the save there), so a turn larger than DRAM is stored whole in pieces.
  SaveTicket continue_save(SaveTicket ticket, std::function<void()> wait, double write_seconds);
  void abort_save(const SaveTicket& ticket);

  // Krul: the layer pairs of the conversation `item` holds, chosen at its turn's end (the
  // layer-merge codec merges them; a later turn's pairs replace them, none leave it unmerged).
  // Ignored for an item gone or already merged.
  void set_layer_pairs(ItemId item, std::vector<kv::krul::LayerPair> pairs);
  // H2O: the attention each token of the conversation `item` holds received over its turn
  // (kv::krul::AttentionStats::token_mass, [tokens, layers, KV heads]), set at the turn's end: a
  // heavy-hitter codec keeps the tokens it chooses by it (once; a later turn sets it again).
  // Ignored for an item gone or already encoded.
  void set_token_mass(ItemId item, std::vector<float> mass);
  // Krul's stored suffix (docs/krul.md decision 12): chunk i of the item keeps only what its
  // layers [first_layers[i], chunk_layers) need once written below DRAM: the layers its
  // conversation's turn-end restoration plan loads (the others it recomputes). Set at each turn's
  // end (the last call wins); a chunk's first layer is fixed when it is first written below DRAM
  // (its DRAM copy keeps every layer until then) and never changes after. Values are clamped to [0,
  // chunk_layers - 1]; chunks past the vector keep every layer. Such an item takes no lossy codec
  // but the layer merge (whose form keeps its layers in order), and only while no chunk of it was
  // written below; it stays off the shared tier. Ignored for an item gone or encoded otherwise than
  // by a layer merge.
  void set_stored_layers(ItemId item, std::vector<int32_t> first_layers);
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
    uint32_t tiers = 0;         // bit t: tier t holds it
    std::byte* dram = nullptr;  // its DRAM copy, with bit kDramTier
    int32_t first_layer = 0;    // ChunkKey::first_layer of every copy below DRAM (and of this)
  };
  struct Item {
    ItemId id = 0;
    std::string session;
    bool exact = true;
    int64_t token_offset = 0;
    int64_t skipped_chunks = 0;           // dropped by token dropping (the data model above)
    int32_t codec = 0;                    // of every chunk, in every tier
    int32_t task = 0;                     // its requests' task family (AdaptCacheOptions::tasks)
    std::vector<kv::krul::LayerPair> layer_pairs;  // its conversation's (set_layer_pairs)
    std::vector<float> token_mass;  // its last turn's, until a heavy-hitter codec used it
    // Its leading chunks that only a match of them all may load (H2O chose their tokens over
    // all of them; ItemRecord::whole_chunks).
    int64_t whole_chunks = 0;
    // Krul's stored suffix: the first layer each chunk keeps once written below DRAM
    // (set_stored_layers); empty: every layer. And whether a chunk's first layer is > 0.
    std::vector<int32_t> stored_layers;
    bool suffix_chunks = false;
    adaptcache::ReuseCount reuse;         // loads and saves, decayed (AdaptCache's Freq)
    std::vector<Chunk> chunks;            // published chunks
    std::array<int64_t, kMaxTiers> held{};  // of those, held by each tier
    std::vector<kv::ChunkHash> pending;   // hashes of chunks a save reserved, not yet published
    int32_t continued_saves = 0;          // open tickets of continue_save: its codec stays
    int32_t pins = 0;
    bool busy = false;    // an I/O thread is moving it
    bool doomed = false;  // dropped while pinned: unreachable, removed at the last release
    uint64_t last_access = 0;
    uint64_t stored_at = 0;
    int64_t shared_written = 0;  // chunks it had when last written through to the shared tier
    // The shared tier its DRAM copy was read from for a waiting request: its first load reports
    // that tier.
    TierIndex fetched_from = kDramTier;
    std::chrono::steady_clock::time_point touched;

    ItemRecord record(const StoreOptions& o) const {
      return {session,        exact,
              token_offset,   codec == 0 ? std::string() : o.codecs[codec].name,
              skipped_chunks, task == 0 ? std::string() : o.adaptcache.tasks[task - 1],
              layer_pairs,    whole_chunks};
    }
    // The chain link chunk i carries.
    int64_t link(int64_t i) const { return i == 0 ? 0 : i + skipped_chunks; }
    // Whether its first `end` chunks are those a match made with `matched_skipped` named: token
    // dropping since then renumbered every chunk but chunk 0.
    bool same_chunks(int64_t end, int64_t matched_skipped) const {
      return skipped_chunks == matched_skipped || (end <= 1 && whole_chunks == 0);
    }
    // Whether a load of its chunks [0, end) matched with `matched_skipped` may pin them now.
    bool serves(int64_t end, int64_t matched_skipped) const {
      return !doomed && std::ssize(chunks) >= end && same_chunks(end, matched_skipped);
    }
    // Tokens left out after chunk 0 when its hashes were made.
    int64_t hash_offset(int32_t block) const { return token_offset - skipped_chunks * block; }
    // Hashed from position 0 (exact, or token-dropped from an exact item): found by content.
    bool content_indexed(int32_t block) const { return hash_offset(block) == 0; }
    bool only_in(TierIndex t) const;
    // Whether its chunks keep (or will keep) fewer than every layer below DRAM.
    bool suffix() const { return !stored_layers.empty() || suffix_chunks; }
  };
  enum class Action { kNone, kPrefetch, kDemote, kTranscode, kEvict, kWriteThrough };
  struct Decision {
    Action action = Action::kNone;
    ItemId item = 0;
    int32_t codec = 0;  // kTranscode's target
  };
  struct PendingCommit {
    SaveTicket ticket;
    std::function<void()> wait;
    double write_seconds = 0;
  };

  explicit KvStore(const StoreOptions& options);
  Status start();
  void adopt(TierIndex tier, std::vector<RecoveredItem> recovered);  // a persistent tier's items
  // Indexes one item tier t holds (REQUIRES mutex_); false if its codec is not this deployment's.
  bool adopt_item(TierIndex t, const RecoveredItem& r);
  // How many leading chunks of a session's item match `prompt`, leaving at least one token to
  // compute: the prompt hashed with `hash_offset` tokens left out after its first block, chunk i
  // (hash hash_of(i)) compared with link i + skipped_chunks of that chain (link 0 for chunk 0).
  int64_t session_chunks_matching(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                  int64_t hash_offset, int64_t skipped_chunks, int64_t num_chunks,
                                  const std::function<kv::ChunkHash(int64_t)>& hash_of) const;
  // find() without counting misses (REQUIRES mutex_).
  std::optional<StoreMatch> match(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                  const std::string& session) const;
  // The next item to write through to the shared tier (REQUIRES mutex_): published, whole in
  // DRAM, grown since it was last written there.
  std::optional<ItemId> write_through_candidate() const;
  void write_through(ItemId id);  // REQUIRES the item is busy and mutex_ is not held
  // Reads the first `count` chunks of an idle item from the shared tier into DRAM when they fit
  // (REQUIRES mutex_ via `lock`, released during the I/O); its first load then reports the shared
  // tier. A chunk that fails drops the item.
  void read_shared_into_dram(ItemId id, int64_t count, std::unique_lock<std::mutex>& lock);
  void io_loop();
  // The next background action (REQUIRES mutex_); with `claim`, marks its item busy.
  Decision next_action(bool claim);
  // The lossy-codec decisions (REQUIRES mutex_): a fixed codec for every item, or AdaptCache's
  // first move over all items when DRAM is below its reserve (kv_store_codecs.cpp).
  Decision codec_decision();
  // Whether `item` may take codec `codec`: a layer merge needs the conversation's pairs, as
  // many as it merges (REQUIRES mutex_).
  bool mergeable(const Item& item, int32_t codec) const;
  // The profile of options_.adaptcache over the opened tiers (capacities set per decision).
  adaptcache::Profile make_adaptcache_profile() const;
  // Re-encodes a busy item's DRAM chunks to `codec` (REQUIRES mutex_ not held); its copies in
  // other tiers, in the old codec, are dropped.
  void transcode(ItemId id, int32_t codec);
  void record_use(Item& item);  // REQUIRES mutex_
  void evict(ItemId id);        // AdaptCache's evict option (REQUIRES mutex_): counted, dropped
  int64_t value_bytes(const Item& item) const { return options_.codecs[item.codec].chunk_bytes; }
  // Bytes of one layer of a raw chunk, and where a chunk of `item` keeps its stored bytes from
  // (its first layer's place in the item's codec: a raw chunk's or a layer merge's).
  int64_t layer_bytes() const { return options_.chunk_bytes / options_.chunk_layers; }
  int64_t suffix_offset(const Item& item, const Chunk& chunk) const;
  // Whether items in `codec` may keep a stored suffix: raw ones, and layer-merged ones (the
  // merge's form keeps its layers in order: kv::krul::merged_layer_offset).
  bool keeps_suffix(int32_t codec) const {
    return codec == 0 || options_.codecs[codec].merged_pairs > 0;
  }
  // Chunks [first, first + count)'s first layers (StoreLease::first_layers): empty when all are 0.
  static std::vector<int32_t> first_layers_of(const Item& item, int64_t first, int64_t count);
  // Reads chunks [first, first + count) of a busy item that DRAM lacks from the nearest lower
  // tier holding each (`lock` holds mutex_ and is released during the I/O), decoding them into
  // DRAM room reserved now, or into `direct` buffers when that is given. Clears busy; on a bad
  // chunk drops the item, counts it and returns DATA_LOSS. *from: the farthest tier read.
  Status fetch(ItemId id, int64_t first, int64_t count, std::vector<AlignedBuffer>* direct,
               TierIndex* from, std::unique_lock<std::mutex>& lock);
  // The item a lease of chunks [0, end) matched with `skipped_chunks` pins (REQUIRES mutex_ via
  // `lock`; waits while an I/O thread moves it), or NOT_FOUND counted as a miss in every tier.
  StatusOr<Item*> leasable(ItemId id, int64_t end, int64_t skipped_chunks,
                           std::unique_lock<std::mutex>& lock);
  void prefetch(ItemId id);  // REQUIRES the item is busy and mutex_ is not held
  void demote(ItemId id);    // likewise
  // Writes the DRAM chunks of a busy item that tier t lacks into it, encoded by its codec (REQUIRES
  // mutex_ held via `lock`, released during the I/O); false if t has no room or failed.
  bool write_down(ItemId id, TierIndex t, std::unique_lock<std::mutex>& lock);
  void expire_items();
  // Drops victims' copies in lower tier t until `bytes` are free there; false if every candidate
  // is exempt.
  bool make_room(TierIndex t, int64_t bytes, ItemId exclude);
  // Frees DRAM by dropping the DRAM copies of items a lower tier holds whole (no I/O) until n
  // chunks fit; false if that is not enough.
  bool reclaim_clean_dram(int64_t n);
  // Removes an item from the store (every tier and index); a pinned one becomes unreachable at
  // once and leaves at its last release.
  void drop_item(ItemId id);
  // Removes an item's copy in tier t; the item leaves the store if that was all of it.
  void drop_copy(ItemId id, TierIndex t);
  void publish(const SaveTicket& ticket, double write_seconds);  // REQUIRES mutex_
  // Publishes now, or once `wait` returns (on an I/O thread): commit_save's (REQUIRES mutex_).
  void queue_publication(SaveTicket ticket, std::function<void()> wait, double write_seconds);
  // Closes a continue_save ticket, if it is one (REQUIRES mutex_).
  void end_continuation(const SaveTicket& ticket);
  // Names chunk `index` of a content-indexed item in the content index, unless a live item that
  // skipped fewer chunks carries the same hash at the same link: an exact item's chunks serve a
  // prompt better than a token-dropped one's (REQUIRES mutex_).
  void index_chunk(const Item& item, int64_t index);
  // The content index entries of `links` (hash, link) that name item `id` or nothing: pointed at
  // the live content-indexed item carrying the hash at that link with the fewest skipped chunks,
  // or erased (after token dropping renumbered `id`'s chunks; REQUIRES mutex_).
  void reindex(ItemId id, std::span<const std::pair<kv::ChunkHash, int64_t>> links);
  // What the policy sees of every item, for decisions about tier t.
  std::vector<ItemView> views(TierIndex t) const;
  bool usable(TierIndex t) const { return tiers_[t]->available(); }
  // The nearest usable tier below DRAM holding the chunk, or -1.
  TierIndex source_of(const Chunk& chunk) const;
  int64_t dram_chunk_bytes() const { return dram_->footprint(options_.chunk_bytes); }
  // Raw chunks DRAM can take now (whole values in free runs of pages: encoded items' smaller
  // values may leave the free pages in pieces).
  int64_t free_dram_chunks() const;
  // Tier t's capacity in chunks as it stores them (its mean stored size per chunk).
  int64_t capacity_chunks(TierIndex t) const;
  void touch(Item& item) { item.last_access = ++clock_; item.touched = std::chrono::steady_clock::now(); }
  void set_held(Item& item, int64_t index, TierIndex t, bool held);
  double mean_item_chunks() const;
  int64_t eviction_window() const;
  int64_t prefetch_window() const;

  StoreOptions options_;
  adaptcache::Profile adaptcache_profile_;  // when options_.adaptcache.enabled
  std::vector<std::unique_ptr<Tier>> tiers_;  // DRAM first, then the lower tiers
  DramTier* dram_ = nullptr;                  // tiers_[0]
  SharedTier* shared_tier_ = nullptr;         // the last tier when it is shared, else null
  TierIndex shared_ = -1;

  mutable std::mutex mutex_;
  std::condition_variable work_;  // background work may be possible
  std::condition_variable idle_;  // an item stopped being busy / an action finished
  std::unordered_map<ItemId, Item> items_;
  std::unordered_map<kv::ChunkHash, std::pair<ItemId, int32_t>> by_hash_;  // exact items only
  std::unordered_map<std::string, ItemId> by_session_;
  std::vector<ItemId> queue_;
  ItemId next_item_ = 1;
  int64_t published_chunks_ = 0;  // chunks of all items
  int64_t published_items_ = 0;   // items with at least one chunk
  std::array<int64_t, kMaxTiers> tier_chunks_{};  // chunks each tier holds
  uint64_t clock_ = 0;
  std::chrono::steady_clock::time_point last_expiry_scan_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  int32_t active_actions_ = 0;
  int64_t dram_chunks_demoting_ = 0;  // DRAM chunks that demotions in flight will free
  std::vector<PendingCommit> commits_;
  std::atomic<int64_t> publications_ = 0;
  bool stopping_ = false;
  std::vector<TierCounters> counters_;  // per tier
  StoreStats stats_;  // the store-wide counters and codec_items (tiers filled by stats())
  std::vector<std::thread> threads_;
};

}  // namespace strata::store
