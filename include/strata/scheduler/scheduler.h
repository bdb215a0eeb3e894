// Continuous-batching scheduler: decides, every step, which sequences run and how many of their
// tokens, under a per-step token budget (chunked prefill) and the KV cache's capacity.
//
// Policy, in order, each step:
//   1. Running sequences, highest priority first (lower `priority` value, then earlier arrival),
//      each get their remaining tokens (1 when decoding; a prefill chunk otherwise) while the
//      token budget lasts. When the KV pool cannot hold a step, the lowest-priority running
//      sequence holding pool blocks is preempted until the step fits: with PreemptionMode::kSwap
//      its KV moves to the host pool (if that has room) and it waits in the swapped queue;
//      otherwise (kRecompute) its KV is freed and it goes back to waiting to recompute its tokens,
//      helped by the prefix cache. Sequences off the pool (KvCacheManager::move_off_pool) need no
//      blocks and are never preempted for them; when the off-pool budget cannot cover their next
//      step, the lowest-priority one is preempted to recompute (its KV outside the pool is lost).
//   2. Swapped sequences resume, in order, while budget, max_num_seqs and KV space allow.
//   3. Waiting sequences, in the same order, are admitted likewise; the first that does not fit
//      stops admission (no overtaking), unless it outranks the lowest-priority running sequence,
//      which is then preempted to make room (the lowest-priority one holding pool blocks). Steps 2
//      and 3 are skipped in a step that preempted for space, and 3 while any sequence is swapped
//      out.
//   4. The step's KV plan is committed.
// A sequence is "prefilling" while it has more known tokens than computed ones beyond the next;
// the engine samples only for chunks that reach the end of a sequence's known tokens.
//
// Not thread-safe: the engine's step thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/kv/kv_cache_manager.h"

namespace strata::scheduler {

enum class PreemptionMode {
  kRecompute,  // free the KV; recompute the sequence's tokens when it runs again
  kSwap,       // copy the KV to the host pool and back (recompute if the host pool is full)
};

struct SchedulerConfig {
  int32_t max_num_seqs = 64;             // sequences in one step
  int64_t max_num_batched_tokens = 512;  // tokens in one step (prefill chunks + decodes)
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;

  // INVALID_ARGUMENT naming the field.
  Status validate() const;
  bool operator==(const SchedulerConfig&) const = default;
};

// The budget of KV held outside the pool (LeanKV's pages): `free_pages` says how many of its
// pages are free, `step_pages(seq)` the most that the next step of an off-pool sequence may take
// of them, and `release(seq)` drops an off-pool sequence's KV there (it was preempted to
// recompute), freeing its pages at once.
struct OffPoolBudget {
  std::function<int64_t()> free_pages;
  std::function<int64_t(SeqId)> step_pages;
  std::function<void(SeqId)> release;
};

struct ScheduledChunk {
  SeqId seq;
  int64_t start_position = 0;  // tokens already in the KV cache
  int64_t num_tokens = 0;      // tokens computed this step
  bool samples = false;        // reaches the end of the known tokens: sample the next one
};

struct ScheduledBatch {
  std::vector<ScheduledChunk> chunks;
  kv::StepCopies copies;         // perform before the forward pass, in StepCopies' order
  // Swapped out or sent back to waiting this step (KvCacheManager::is_swapped tells which).
  std::vector<SeqId> preempted;
  // Of those, the ones whose KV was off the pool (its budget ran short; released already).
  std::vector<SeqId> preempted_off_pool;
  // Removed because they cannot fit in the KV pool even alone; the engine fails them.
  std::vector<SeqId> aborted;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv);
  // Sets the budget that off-pool sequences' steps draw from (none by default: a deployment
  // without off-pool KV has no such sequences).
  void set_off_pool_budget(OffPoolBudget budget) { off_pool_ = std::move(budget); }

  // Queues a new sequence. INVALID_ARGUMENT if the id is in use or the prompt is empty, or if the
  // prompt alone could never fit in the KV pool. `cacheable` and `layout`: see
  // KvCacheManager::add_sequence (kept when the sequence is recomputed).
  Status add(SeqId seq, std::vector<TokenId> prompt, int32_t priority, std::string tenant_salt,
             bool cacheable = true, kv::KvLayout layout = {});
  // Adds `child` as a running copy of running `parent` sharing its KV (KvCacheManager::fork):
  // parallel samples of one prompt. Errors as KvCacheManager::fork, or INVALID_ARGUMENT if the
  // parent is not running.
  Status fork(SeqId parent, SeqId child);
  // Drops a sequence wherever it is and frees its KV at once (finish or cancel). Unknown: no-op.
  void remove(SeqId seq);
  // Sends a sequence of the batch just scheduled back to waiting with its KV freed, to compute
  // all its tokens again: the load it was scheduled with failed. The caller drops its chunk from
  // the batch before running it. Not counted as a preemption.
  void restart(SeqId seq);

  ScheduledBatch schedule();
  // The executor ran `batch`: record the computed tokens (publishing full blocks).
  void on_batch_done(const ScheduledBatch& batch);

  // Waiting sequences, the next to be admitted first.
  const std::vector<SeqId>& waiting() const { return waiting_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  size_t num_swapped() const { return swapped_.size(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty() || !swapped_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }  // swaps and recomputes
  int64_t num_swap_outs() const { return num_swap_outs_; }
  // The most sequences running (holding KV, in the pool or off it) after one schedule().
  int64_t peak_running() const { return peak_running_; }

 private:
  struct Entry {
    int32_t priority = 0;
    uint64_t arrival = 0;  // order of add(); FCFS tie-break
    std::string tenant_salt;
    bool cacheable = true;
  };
  bool runs_before(SeqId a, SeqId b) const;
  void insert_sorted(std::vector<SeqId>& queue, SeqId seq) const;
  // Swaps out a running sequence, or frees its KV and queues it to recompute its tokens.
  void preempt(SeqId seq, ScheduledBatch& batch);
  // Frees a sequence's KV and queues it to compute its tokens again (REQUIRES: not running).
  void requeue(SeqId seq);
  // Moves sequences from `queue` to running while they fit; returns false if one did not.
  bool resume(std::vector<SeqId>& queue, std::vector<kv::KvRequest>& requests, int64_t& budget,
              ScheduledBatch& batch, bool may_preempt);
  int64_t remaining_tokens(SeqId seq) const;
  // The lowest-priority running sequence at index >= from whose KV is off the pool (or in it).
  std::optional<SeqId> last_running(size_t from, bool off_pool) const;

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  OffPoolBudget off_pool_;
  std::unordered_map<SeqId, Entry> entries_;
  std::vector<SeqId> waiting_;  // sorted by runs_before
  std::vector<SeqId> running_;  // sorted by runs_before
  std::vector<SeqId> swapped_;  // sorted by runs_before; KV in the host pool
  uint64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t num_swap_outs_ = 0;
  int64_t peak_running_ = 0;
};

}  // namespace strata::scheduler
