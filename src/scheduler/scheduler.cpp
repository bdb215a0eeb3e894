#include "strata/scheduler/scheduler.h"

#include <algorithm>

#include "strata/common/check.h"

namespace strata::scheduler {

Status SchedulerConfig::validate() const {
  if (max_num_seqs < 1) {
    return invalid_argument_error("scheduler.max_num_seqs must be at least 1, got " +
                                  std::to_string(max_num_seqs));
  }
  if (max_num_batched_tokens < 1) {
    return invalid_argument_error("scheduler.max_num_batched_tokens must be at least 1, got " +
                                  std::to_string(max_num_batched_tokens));
  }
  return Status();
}

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv)
    : config_(config), kv_(kv) {
  STRATA_CHECK(config.validate().ok()) << config.validate().to_string();
}

bool Scheduler::runs_before(SeqId a, SeqId b) const {
  const Entry& ea = entries_.at(a);
  const Entry& eb = entries_.at(b);
  if (ea.priority != eb.priority) return ea.priority < eb.priority;
  return ea.arrival < eb.arrival;
}

void Scheduler::insert_sorted(std::vector<SeqId>& queue, SeqId seq) const {
  auto pos = std::upper_bound(queue.begin(), queue.end(), seq,
                              [&](SeqId a, SeqId b) { return runs_before(a, b); });
  queue.insert(pos, seq);
}

Status Scheduler::add(SeqId seq, std::vector<TokenId> prompt, int32_t priority,
                      std::string tenant_salt, bool cacheable, kv::KvLayout layout) {
  if (entries_.contains(seq)) {
    return invalid_argument_error("sequence " + std::to_string(seq.value) + " already queued");
  }
  const kv::KvGeometry& g = kv_.geometry();
  const int64_t blocks_needed =
      (static_cast<int64_t>(prompt.size()) + g.block_size_tokens - 1) / g.block_size_tokens *
      g.num_layers;
  if (blocks_needed > g.num_blocks) {
    return invalid_argument_error("prompt of " + std::to_string(prompt.size()) +
                                  " tokens needs " + std::to_string(blocks_needed) +
                                  " KV blocks; the pool has " + std::to_string(g.num_blocks));
  }
  STRATA_RETURN_IF_ERROR(kv_.add_sequence(seq, std::move(prompt), tenant_salt, cacheable, layout));
  entries_.emplace(seq, Entry{priority, next_arrival_++, std::move(tenant_salt), cacheable});
  insert_sorted(waiting_, seq);
  return Status();
}

Status Scheduler::fork(SeqId parent, SeqId child) {
  auto it = entries_.find(parent);
  if (it == entries_.end() ||
      std::find(running_.begin(), running_.end(), parent) == running_.end()) {
    return invalid_argument_error("sequence " + std::to_string(parent.value) + " is not running");
  }
  if (entries_.contains(child)) {
    return invalid_argument_error("sequence " + std::to_string(child.value) + " already queued");
  }
  STRATA_RETURN_IF_ERROR(kv_.fork(parent, child));
  Entry entry = it->second;
  entry.arrival = next_arrival_++;
  entries_.emplace(child, std::move(entry));
  insert_sorted(running_, child);
  return Status();
}

void Scheduler::remove(SeqId seq) {
  if (!entries_.erase(seq)) return;
  std::erase(waiting_, seq);
  std::erase(running_, seq);
  std::erase(swapped_, seq);
  kv_.free(seq);
}

int64_t Scheduler::remaining_tokens(SeqId seq) const {
  return static_cast<int64_t>(kv_.tokens(seq).size()) - kv_.num_computed_tokens(seq);
}

std::optional<SeqId> Scheduler::last_running(size_t from, bool off_pool) const {
  for (size_t i = running_.size(); i-- > from;) {
    if (kv_.is_off_pool(running_[i]) == off_pool) return running_[i];
  }
  return std::nullopt;
}

void Scheduler::preempt(SeqId seq, ScheduledBatch& batch) {
  std::erase(running_, seq);
  batch.preempted.push_back(seq);
  if (kv_.is_off_pool(seq)) {
    batch.preempted_off_pool.push_back(seq);
    if (off_pool_.release) off_pool_.release(seq);
  }
  ++num_preemptions_;
  // A sequence off the pool has no blocks to swap (can_swap_out is false): it recomputes.
  if (config_.preemption_mode == PreemptionMode::kSwap && kv_.can_swap_out(seq)) {
    kv_.swap_out(seq, &batch.copies);
    insert_sorted(swapped_, seq);
    ++num_swap_outs_;
    return;
  }
  requeue(seq);
}

void Scheduler::restart(SeqId seq) {
  std::erase(running_, seq);
  requeue(seq);
}

void Scheduler::requeue(SeqId seq) {
  std::vector<TokenId> tokens = kv_.tokens(seq);
  kv::KvLayout layout = kv_.layout(seq);
  kv_.free(seq);
  const Entry& entry = entries_.at(seq);
  const Status status = kv_.add_sequence(seq, std::move(tokens), entry.tenant_salt, entry.cacheable,
                                         std::move(layout));
  STRATA_CHECK(status.ok()) << status.to_string();
  insert_sorted(waiting_, seq);
}

bool Scheduler::resume(std::vector<SeqId>& queue, std::vector<kv::KvRequest>& requests,
                       int64_t& budget, ScheduledBatch& batch, bool may_preempt) {
  while (!queue.empty() && budget > 0) {
    const SeqId seq = queue.front();
    const int64_t cached = kv_.lookup_prefix(seq);
    const kv::KvRequest request{seq, std::min(remaining_tokens(seq) - cached, budget)};
    const bool has_seat = running_.size() < static_cast<size_t>(config_.max_num_seqs);
    std::vector<kv::KvRequest> trial = requests;
    trial.push_back(request);
    if (has_seat && kv_.prepare(std::move(trial)).ok()) {
      requests.push_back(request);
      budget -= request.num_new_tokens;
      queue.erase(queue.begin());
      insert_sorted(running_, seq);
      continue;
    }
    // Make room by preempting a running sequence it outranks; otherwise wait (no overtaking).
    const std::optional<SeqId> victim_found = last_running(0, false);
    if (!may_preempt || !victim_found || !runs_before(seq, *victim_found)) return false;
    const SeqId victim = *victim_found;
    auto it = std::find_if(requests.begin(), requests.end(),
                           [&](const kv::KvRequest& r) { return r.seq == victim; });
    if (it != requests.end()) {
      budget += it->num_new_tokens;
      requests.erase(it);
    }
    preempt(victim, batch);
  }
  return true;
}

ScheduledBatch Scheduler::schedule() {
  ScheduledBatch batch;
  std::vector<kv::KvRequest> requests;
  int64_t budget = config_.max_num_batched_tokens;

  // 1. Running sequences, in priority order; preempt from the back when the pool (or the
  // off-pool budget) is full.
  int64_t off_pool_free = off_pool_.free_pages ? off_pool_.free_pages() : 0;
  int64_t off_pool_taken = 0;
  bool pool_requests = false;  // a request before seq's holds pool blocks
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const SeqId seq = running_[i];
    if (remaining_tokens(seq) == 0) {  // finished, waiting to be removed by the engine
      ++i;
      continue;
    }
    const kv::KvRequest request{seq, std::min(remaining_tokens(seq), budget)};
    const bool off_pool = kv_.is_off_pool(seq);
    const int64_t step_pages = off_pool ? off_pool_.step_pages(seq) : 0;
    bool fits = off_pool && off_pool_taken + step_pages <= off_pool_free;
    if (!off_pool) {
      std::vector<kv::KvRequest> trial = requests;
      trial.push_back(request);
      fits = kv_.prepare(std::move(trial)).ok();
    }
    if (fits) {
      requests.push_back(request);
      budget -= request.num_new_tokens;
      if (off_pool) {
        off_pool_taken += step_pages;
      } else {
        pool_requests = true;
      }
      ++i;
      continue;
    }
    // Preempt the lowest-priority sequence holding what is short (seq itself at worst).
    const SeqId victim = *last_running(i, off_pool);
    if (!off_pool && victim == seq && !pool_requests) {
      // Alone in the pool and still too big: it can never run.
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      entries_.erase(seq);
      kv_.free(seq);
      batch.aborted.push_back(seq);
      continue;
    }
    preempt(victim, batch);
    if (off_pool && off_pool_.free_pages) off_pool_free = off_pool_.free_pages();  // its pages
  }

  // 2-3. Swapped sequences resume first; new ones wait while any is swapped out.
  if (batch.preempted.empty() && resume(swapped_, requests, budget, batch, false) &&
      swapped_.empty()) {
    resume(waiting_, requests, budget, batch, true);
  }

  peak_running_ = std::max(peak_running_, static_cast<int64_t>(running_.size()));
  if (requests.empty()) return batch;
  StatusOr<kv::KvPlan> plan = kv_.prepare(requests);
  STRATA_CHECK(plan.ok()) << "a plan built from fitting requests failed: "
                          << plan.status().to_string();
  kv_.commit(std::move(plan).value(), &batch.copies);
  for (const kv::KvRequest& r : requests) {
    const int64_t start = kv_.num_computed_tokens(r.seq);
    const bool samples =
        start + r.num_new_tokens == static_cast<int64_t>(kv_.tokens(r.seq).size());
    batch.chunks.push_back({r.seq, start, r.num_new_tokens, samples});
  }
  return batch;
}

void Scheduler::on_batch_done(const ScheduledBatch& batch) {
  for (const ScheduledChunk& chunk : batch.chunks) {
    if (entries_.contains(chunk.seq)) kv_.mark_computed(chunk.seq, chunk.num_tokens);
  }
}

}  // namespace strata::scheduler
