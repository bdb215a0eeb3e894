// The restore coordinator: where each sequence's KV comes from besides computing it, and where it
// goes when the turn ends. It owns the KV store (CachedAttention's AttentionStore, store/) and
// stands between it and the step loop:
//
//   admission   looks the prompt up in the store (by session, then by content) and lets the
//               sequence's first commit load the stored prefix instead of computing it;
//   each step   looks the queue head up again when saves were published, pins the chunks of the
//               scheduled loads (a load that fails sends its sequence back to recompute), adds to
//               the pass the saves of the blocks it completes (asynchronous saving, layer by layer)
//               and the pre-load of the next waiting request's first layers (the read buffer,
//               sized per request from measured load and prefill times), and tells the store
//               which items the queue will load (scheduler-aware prefetch and eviction);
//   turn end    publishes the sequence's saved chunks, or gives them back (a save DRAM was short
//               for publishes its chunks pass by pass, so the store moves them down and takes
//               the rest).
//
// Decisions per request and per layer: blocks in the device pool's prefix cache are reused by the
// KV cache manager; blocks the store holds are loaded (layers [0, k) ahead of the pass when
// pre-loaded, the rest inside it, each before its layer's attention); the rest is computed.
// Restoration planners of later techniques (recompute/load splits, speculative recall) plan here.
//
// Step-loop thread only, except look_up_shared() and end_session() (thread-safe).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/executor/forward_batch.h"
#include "strata/kv/kv_types.h"
#include "strata/scheduler/scheduler.h"
#include "strata/store/kv_store.h"

namespace strata::executor {
class Executor;
}  // namespace strata::executor
namespace strata::kv {
class KvCacheManager;
}

namespace strata::restore {

struct RestoreOptions {
  // The store's tiers and read buffer (the deployment's kv_store section); the coordinator adds
  // the chunk layout and host-memory hooks from the executor (StoreOptions::from_config).
  store::StoreConfig store;
  // Waiting requests whose prompts are looked up again when the store publishes saves.
  int64_t lookup_depth = 16;
  // The scheduler's tokens per step: a restoration recomputes no more history rows per layer
  // than the step leaves room for.
  int64_t max_batched_tokens = 512;
};

// What the coordinator did, cumulative. The engine reports these (EngineStats).
struct RestoreStats {
  std::optional<store::StoreStats> store;  // absent without a store
  // Tensor parallelism: ranks 1.. N-1's stores as they last reported them (empty otherwise; tiers
  // named as rank 0's: store::StoreFollowers::rank_stats).
  std::vector<store::StoreStats> rank_stores;
  // Prompt tokens loaded from the store, by the farthest tier their load had to read from.
  std::map<std::string, int64_t, std::less<>> store_loaded_tokens;
  int64_t store_load_failures = 0;  // loads of corrupt or vanished chunks: the prompt recomputed
  int64_t store_saved_tokens = 0;   // tokens whose KV finished requests saved
  // The device pool as the store's top tier: KV bytes it received from the store (loads) and
  // sent to it (saves), and the executor's time on those copies.
  int64_t pool_bytes_loaded = 0;
  int64_t pool_bytes_saved = 0;
  double pool_load_seconds = 0;
  int64_t pool_loads = 0;  // forward passes with loads
  double pool_save_seconds = 0;
  int64_t pool_saves = 0;  // forward passes with saves
  int64_t preloads = 0;    // requests whose first layers were pre-loaded
  int64_t preloaded_layers = 0;  // layers those pre-loads held, summed
  // Resumed turns restored by recomputing part of their history (kv_store.restore_mode krul or
  // partial; krul's may recompute none and read all of it beside the pass), and of their
  // history's token-layers, those recomputed (the rest were loaded).
  int64_t partial_restores = 0;
  int64_t restore_history_token_layers = 0;
  int64_t restore_recomputed_token_layers = 0;
  // Passes that restored one (a failed load's included): their time, and of it the time their
  // layers waited for loaded KV (ForwardResult::load_wait_seconds: the pipeline's bubble, CPU).
  double restore_pass_seconds = 0;
  double restore_wait_seconds = 0;
  // Krul's layer pairs (kv_store.layer_pairing): turns that ended with their conversation's pairs
  // chosen, the layers those pairs cover (summed), and stored chunks restored from merged pairs.
  int64_t pair_maps = 0;
  int64_t paired_layers = 0;
  int64_t merged_chunks_loaded = 0;
  // Krul's stored suffix (kv_store.stored_suffix): turns that ended with their conversation's
  // chunks set to keep only the layers its restoration loads, the leading layers so left out
  // (chunks x layers, summed over those turns), and resumed turns that recomputed their whole
  // prompt because a stored suffix could not be restored (its first blocks were in the pool's
  // prefix cache, so the history was not restored from position 0).
  int64_t suffix_turns = 0;
  int64_t suffix_dropped_chunk_layers = 0;
  int64_t suffix_recomputes = 0;

  int64_t loaded_tokens(std::string_view tier) const {
    auto it = store_loaded_tokens.find(tier);
    return it == store_loaded_tokens.end() ? 0 : it->second;
  }
};

// How a sequence's request reaches the store.
struct SequenceInfo {
  std::string tenant;   // roots its content hashes: tenants never share stored KV
  std::string session;  // the conversation (tenant-qualified); empty: by content only
  bool scores_prompt = false;  // prompt logprobs: always computed, never stored
  int32_t task = 0;            // the task family its stored KV is weighed under (task_index)
};

// Prompt tokens a sequence loaded from the store in this step, and the tier the slowest came from.
struct LoadedPrefix {
  SeqId seq;
  int64_t tokens = 0;
  std::string tier;  // a store tier's name ("dram", "ssd", ...)
};

class StreamedRead;

class RestoreCoordinator {
 public:
  // Opens the store (store::KvStore::open) for the executor's pool format and geometry; cached KV
  // is keyed by `model_fingerprint` (model content) and the layout.
  static StatusOr<std::unique_ptr<RestoreCoordinator>> open(const RestoreOptions& options,
                                                            executor::Executor& executor,
                                                            kv::KvCacheManager& kv,
                                                            scheduler::Scheduler& scheduler,
                                                            uint64_t model_fingerprint);
  ~RestoreCoordinator();
  RestoreCoordinator(const RestoreCoordinator&) = delete;
  RestoreCoordinator& operator=(const RestoreCoordinator&) = delete;

  // Admission, before the sequence joins the scheduler: registers it and returns the longest
  // stored prefix of its prompt (nullopt for a scored prompt, or when nothing is stored).
  std::optional<store::StoreMatch> look_up(SeqId seq, std::span<const TokenId> prompt,
                                           SequenceInfo info);
  // The sequence joined the scheduler with `dropped_tokens` dropped after its first block
  // (context overflow): its first commit loads what `match` holds of the truncated prompt.
  void admitted(SeqId seq, int64_t dropped_tokens, const std::optional<store::StoreMatch>& match);
  // `child` forked from `parent` (which computed the prompt they share): registered with the
  // parent's tenant and truncation, and nothing to load.
  void forked(SeqId parent, SeqId child);

  // Before scheduling: the first waiting requests look their prompts up again when the store has
  // published saves since (a request queued behind the turn that saves its history loads it).
  void before_schedule();
  // After scheduling: preempted sequences may load their prefix again; the batch's loads are
  // pinned into `forward` (a sequence whose load fails goes back to waiting and its chunk leaves
  // `batch`); the store learns the queue. Returns the loads made.
  std::vector<LoadedPrefix> restore(scheduler::ScheduledBatch& batch,
                                    executor::ForwardBatch& forward);
  // Adds to `forward` (its chunks built) the saves of the blocks they complete and the pre-load
  // of the next waiting request with a stored prefix.
  void plan_copies(executor::ForwardBatch& forward);
  // After the pass (`result` null when it failed): unpins the loads, drops the pre-loads of
  // sequences that ran, hands the save copies to their sequences, and measures the load
  // bandwidth and prefill time that size the read buffer. A sequence whose load was read beside
  // the pass and failed (ForwardResult::failed_loads) goes back to waiting, to be recomputed:
  // the caller drops its chunk's results.
  void after_pass(const executor::ForwardBatch& forward, const executor::ForwardResult* result,
                  double seconds);
  // The request ended: publishes its saved chunks (`publish`: it finished normally) or gives
  // them back, and forgets the sequence.
  void finish(SeqId seq, bool publish);

  // Before a request reaches the step loop, on the submitting thread: asks the store's shared
  // tier (the remote tier other replicas write) for the prompt, so that look_up() finds what
  // another replica stored (store::KvStore::look_up_shared). Thread-safe; a no-op without a
  // shared tier or for a scored prompt.
  void look_up_shared(std::span<const TokenId> prompt, const SequenceInfo& info) const;
  // The prompt tokens the store holds for `prompt` now and the farthest tier they would be loaded
  // from (tokens 0 and "" when none), without counting a lookup. Thread-safe.
  LoadedPrefix stored_prefix(std::span<const TokenId> prompt, const SequenceInfo& info) const;
  // Drops a session's stored KV; false if the store holds none for it. Thread-safe.
  bool end_session(const std::string& session);
  // SequenceInfo::task of a request's task family (its kv_task): 0 for "" or where no quality
  // profile weighs families (no AdaptCache); INVALID_ARGUMENT listing the profile's families for
  // a name it does not list. Thread-safe.
  StatusOr<int32_t> task_index(std::string_view family) const;
  RestoreStats stats() const;

 private:
  struct Sequence;
  RestoreCoordinator(const RestoreOptions& options, executor::Executor& executor,
                     kv::KvCacheManager& kv, scheduler::Scheduler& scheduler,
                     uint64_t model_fingerprint);
  // The root of a tenant's chained content hashes (the prefix cache's too).
  kv::ChunkHash root(const std::string& tenant) const;
  // Tensor parallelism: cuts a lookup's match to the leading chunks every rank's store holds.
  void held_by_all_ranks(std::optional<store::StoreMatch>& match) const;
  // Looks a sequence's current tokens up again, attaching an exact match.
  void look_up_again(SeqId seq, Sequence& sequence);
  void attach(SeqId seq, Sequence& sequence, const store::StoreMatch& match);
  // The sequence's load cannot be made: it goes back to waiting to compute its whole prompt (and
  // looks nothing up again), its chunk leaves `batch`.
  void recompute(SeqId seq, Sequence& sequence, scheduler::ScheduledBatch& batch);
  // Pins a load's chunks; the farthest tier read, or the failure (also when a chunk lacks the
  // layers that load it under `rows`, a restoration's, or all of them when empty: a stored suffix
  // changed since it was planned).
  StatusOr<store::TierIndex> pin_load(Sequence& sequence, const kv::BlockLoad& load,
                                      std::span<const int64_t> rows, executor::KvLoad* kv_load);
  // A restoration's load on an executor that streams loads (Executor::streams_loads): pins the
  // history's chunks now (KvStore::pin_layers) and reads those DRAM lacks beside the pass, each
  // layer's part from that layer's recompute boundary in `rows` on (streamed_read.h, started by
  // plan_copies); a layer-merged item's chunks, in DRAM too, are restored there by layer ranges;
  // pin_load for an encoded item. The farthest tier the chunks are read from, or the failure.
  StatusOr<store::TierIndex> stream_load(SeqId seq, Sequence& sequence, const kv::BlockLoad& load,
                                         std::span<const int64_t> rows, executor::KvLoad* kv_load);
  // After the pass (`result` null when it failed): waits for the streamed loads' reads (their
  // leases join the step's) and counts the loaded tokens of those that did not fail.
  void finish_streamed_loads(const executor::ForwardResult* result);
  void plan_saves(executor::ForwardBatch& forward);
  // Krul (restore_mode krul or partial, partial_restore.cpp): the rows each layer of a resumed
  // turn recomputes of its `history` stored tokens (non-increasing with depth, whole blocks, at
  // most `room`), Krul's planner costing the loads as reads from tier `from` beside the compute
  // of the step's `other_tokens` scheduled tokens; empty: load them all before the pass. A
  // stored suffix's `floor` (recompute_floor; empty: none) is recomputed at least, even beyond
  // `room`. Layer `pairs` (the history's merged form; empty: raw) load one merged suffix each
  // (read at the merged form's bytes, restored into both layers), which the planner weighs.
  std::vector<int64_t> restoration_plan(int64_t history, int64_t room, store::TierIndex from,
                                        int64_t other_tokens, std::span<const int64_t> floor,
                                        const std::vector<kv::krul::LayerPair>& pairs) const;
  // The rows each layer must recompute of a history whose chunks from block 0 keep layers from
  // `first_layers` on (store::StoreLease::first_layers): up to the end of the last chunk lacking
  // the layer. Empty for empty `first_layers`.
  std::vector<int64_t> recompute_floor(std::span<const int32_t> first_layers) const;
  // Krul's stored suffix: the conversation's `chunks` chunks in `item` keep only the layers a
  // restoration of them from the nearest tier below DRAM would load (its plan now, at most half
  // the step's tokens recomputed, with the layer `pairs` the item is to be merged by). At a
  // turn's end (counted in the stats), and before a piece of a save short of DRAM is published
  // (the chunks so far, unpaired: they may go below before the turn ends, and a chunk's layers
  // are fixed at its first write there).
  void store_suffix(store::ItemId item, int64_t chunks, bool turn_end,
                    const std::vector<kv::krul::LayerPair>& pairs);
  // Rewrites the chunks of the sequences restore() planned a restoration for: their history
  // joins the pass (SequenceChunk::restored_tokens, computed_rows).
  void plan_restorations(executor::ForwardBatch& forward);
  // Adds a restoring chunk to the counters (sign 1), or takes it out (-1: its load failed).
  void count_restoration(const executor::SequenceChunk& chunk, int64_t sign);
  // Krul's layer pairs and H2O's heavy hitters: whether attention is observed
  // (kv_store.layer_pairing krul, or an H2O fixed codec); the chunks observed (every chunk of a
  // sequence that saves, but a restoration's); the pairs of a sequence's conversation at its
  // turn's end from the attention its turn observed (empty without pairing); a merged load's
  // chunks restored to raw ones in buffers kept until after_pass (partial_restore.cpp).
  bool observes_attention() const;
  void observe_attention(executor::ForwardBatch& forward);
  std::vector<kv::krul::LayerPair> choose_layer_pairs(
      const std::optional<kv::krul::AttentionStats>& stats);
  Status unmerge_load(const store::StoreLease& lease, std::span<const std::byte*> chunks);
  void plan_preload(executor::ForwardBatch& forward);
  // Read-buffer layers for a request loading `chunks` chunks and computing `new_tokens`.
  int64_t preload_layers(int64_t chunks, int64_t new_tokens) const;
  void release_preload(SeqId seq, Sequence& sequence);
  void end_save(SeqId seq, Sequence& sequence, bool publish);
  // Publishes the chunks the sequence's save has written (all it reserved) and, unless `last`,
  // goes on with a ticket for the chunks after them (KvStore::continue_save).
  void commit_written(SeqId seq, Sequence& sequence, bool last);
  void publish_queue();

  RestoreOptions options_;
  bool heavy_hitters_ = false;  // an H2O fixed codec: each turn's token mass goes to the store
  executor::Executor& executor_;
  kv::KvCacheManager& kv_;
  scheduler::Scheduler& scheduler_;
  uint64_t model_fingerprint_ = 0;
  std::unique_ptr<store::KvStore> store_;
  // Tensor parallelism: the other ranks' stores, told what store_ does (null with one rank).
  store::StoreFollowers* followers_ = nullptr;
  // The format of each of the store's item codecs (nullopt: raw chunks), for KvLoad::encoding.
  std::vector<std::optional<kv::KvFormat>> codec_formats_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> sequences_;
  std::vector<store::StoreLease> step_leases_;  // pinned by restore(), released by after_pass()
  // The layer-merge codec's (before streamed_: their reads restore with it until joined).
  kv::krul::MergedForm merged_form_;
  // This step's streamed loads, started by plan_copies(), finished by after_pass(): the reads,
  // and the history tokens, tier and merged chunks counted once the pass kept them.
  struct StreamedLoad {
    SeqId seq;
    std::shared_ptr<StreamedRead> read;
    int64_t tokens = 0;
    store::TierIndex tier = store::kDramTier;
    int64_t merged_chunks = 0;
  };
  std::vector<StreamedLoad> streamed_;
  std::vector<store::ItemId> queue_;            // last queue given to the store
  // Measured for sizing the read buffer (0 until measured): load bandwidth into the pool, and
  // prefill time per token per layer; moving averages.
  double load_bytes_per_second_ = 0;
  double prefill_seconds_per_token_layer_ = 0;
  // Restorations: the time to pin one stored chunk and read every layer of it, by the farthest
  // tier a load read from (moving averages), and the rows each layer recomputes of the sequences
  // restore() planned this step.
  std::array<double, store::kMaxTiers> pin_seconds_per_chunk_{};
  double restore_seconds_per_layer_ = 0;  // a merged chunk's layer restored beside the pass
  std::unordered_map<SeqId, std::vector<int64_t>> restorations_;
  std::vector<std::vector<std::byte>> unmerged_chunks_;  // this step's (unmerge_load)
  RestoreStats stats_;
};

}  // namespace strata::restore
