#include "strata/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <utility>

#include "active_request.h"
#include "strata/common/check.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/kv/prefix_hash.h"
#include "strata/model/model_source.h"
#include "strata/sampling/stop_checker.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::engine {

using Clock = std::chrono::steady_clock;

StatusOr<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<model::ModelSource> source,
                                                 std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                                                 const EngineOptions& options) {
  STRATA_RETURN_IF_ERROR(options.scheduler.validate());
  const double truncation = options.scheduler.overflow_truncation_fraction;
  if (!(truncation >= 0 && truncation <= 0.9)) {
    return invalid_argument_error("overflow_truncation_fraction must be in [0, 0.9], got " +
                                  std::to_string(truncation));
  }
  if (options.executor.page_format && options.kv_store.enabled()) {
    return invalid_argument_error(
        "kv_cache.page_format " + kv::format_name(*options.executor.page_format) +
        " with the KV store: stored chunks hold the compute dtype's exact KV, and quantized "
        "pages do not save to it yet; unset one of them");
  }
  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  engine->source_ = std::move(source);
  engine->tokenizer_ = std::move(tokenizer);
  // The executor is built on the step thread and used only there: libtorch's CPU thread pool
  // then belongs to that one thread, instead of a second pool (of the creating thread) competing
  // for the cores and making every parallel region sleep and wake (measured: 2x slower decode).
  std::promise<Status> started;
  std::future<Status> ready = started.get_future();
  engine->thread_ = std::thread([e = engine.get(), &started] {
    Status status = e->start_on_step_thread();
    const bool ok = status.ok();
    started.set_value(std::move(status));
    if (ok) e->loop();
  });
  Status status = ready.get();
  if (!status.ok()) {
    engine->thread_.join();
    return status;
  }
  return engine;
}

Status Engine::start_on_step_thread() {
  executor::ExecutorOptions executor_options = options_.executor;
  executor_options.observe_token_mass =
      options_.kv_store.enabled() &&
      store::heavy_hitter_codec(options_.kv_store.adaptcache.fixed_codec);
  STRATA_ASSIGN_OR_RETURN(executor_, executor::Executor::create(*source_, executor_options));
  executor_->init_calling_thread();
  // The fingerprint keeps cached KV of different models (or weights) apart, wherever they live.
  model_fingerprint_ = source_->content_fingerprint();
  kv_ = std::make_unique<kv::KvCacheManager>(
      executor_->kv_geometry(), executor_->kv_format(),
      kv::PrefixCacheOptions{options_.executor.enable_prefix_caching, model_fingerprint_});
  if (options_.executor.page_format &&
      !(*options_.executor.page_format == executor_->kv_format())) {
    layout_.formats.assign(executor_->kv_geometry().num_layers, *options_.executor.page_format);
  }
  scheduler_ = std::make_unique<scheduler::Scheduler>(options_.scheduler, *kv_);
  if (options_.executor.leankv.enabled) {
    scheduler_->set_off_pool_budget(
        {[this] { return executor_->leankv_free_pages(); },
         [this](SeqId seq) { return executor_->leankv_step_pages(seq); },
         [this](SeqId seq) { executor_->end_sequence(seq); }});
  } else if (options_.executor.freekv.enabled) {
    // FreeKV's host pages are not budgeted yet (docs/freekv.md): a step never waits for them.
    scheduler_->set_off_pool_budget({[] { return std::numeric_limits<int64_t>::max() / 2; },
                                     [](SeqId) { return int64_t{0}; },
                                     [this](SeqId seq) { executor_->end_sequence(seq); }});
  }
  if (options_.kv_store.enabled()) {
    restore::RestoreOptions restore{options_.kv_store};
    restore.lookup_depth = std::min<int64_t>(options_.scheduler.max_num_seqs, restore.lookup_depth);
    restore.max_batched_tokens = options_.scheduler.max_num_batched_tokens;
    STRATA_ASSIGN_OR_RETURN(restore_, restore::RestoreCoordinator::open(
                                          restore, *executor_, *kv_, *scheduler_,
                                          model_fingerprint_));
  }
  refresh_stats();  // stats are meaningful before the first step
  return Status();
}

Engine::~Engine() {
  {
    std::scoped_lock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

const model::ModelConfig& Engine::model_config() const { return executor_->config(); }

bool Engine::end_session(const std::string& session) {
  return restore_ != nullptr && restore_->end_session(session);
}

std::pair<int64_t, std::string> Engine::stored_prefix(std::span<const TokenId> prompt,
                                                      const std::string& tenant,
                                                      const std::string& session) const {
  if (!restore_) return {0, ""};
  restore::LoadedPrefix stored = restore_->stored_prefix(prompt, {tenant, session, false});
  return {stored.tokens, stored.tier};
}

EngineStats Engine::stats() const {
  std::scoped_lock lock(mutex_);
  return stats_;
}

StatusOr<std::shared_ptr<RequestStream>> Engine::submit(GenerateRequest request) {
  STRATA_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams,
                          submit_parallel(std::move(request), 1));
  return streams.front();
}

StatusOr<std::vector<std::shared_ptr<RequestStream>>> Engine::submit_parallel(
    GenerateRequest request, int32_t n) {
  const model::ModelConfig& config = executor_->config();
  if (n < 1) return invalid_argument_error("n must be >= 1, got " + std::to_string(n));
  if (n > 1 && !request.forced_completion.empty()) {
    return invalid_argument_error("n: forced completions are scored once (n = 1)");
  }
  if (request.prompt_token_ids.empty()) {
    return invalid_argument_error("prompt: must contain at least one token");
  }
  for (TokenId t : request.prompt_token_ids) {
    if (t < 0 || t >= config.vocab_size) {
      return invalid_argument_error("prompt: token id " + std::to_string(t) +
                                    " is outside the vocabulary [0, " +
                                    std::to_string(config.vocab_size) + ")");
    }
  }
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_token_ids.size());
  if (prompt_len >= config.max_context_tokens &&
      options_.scheduler.overflow_truncation_fraction == 0) {
    return invalid_argument_error("prompt: " + std::to_string(prompt_len) +
                                  " tokens leave no room in the context window of " +
                                  std::to_string(config.max_context_tokens));
  }
  for (TokenId t : request.forced_completion) {
    if (t < 0 || t >= config.vocab_size) {
      return invalid_argument_error("forced_completion: token id " + std::to_string(t) +
                                    " is outside the vocabulary [0, " +
                                    std::to_string(config.vocab_size) + ")");
    }
  }
  if (!request.forced_completion.empty()) {
    request.sampling.max_tokens = static_cast<int32_t>(request.forced_completion.size());
    request.sampling.ignore_eos = true;
    request.sampling.stop_token_ids.clear();
    request.sampling.stop.clear();
  }
  STRATA_RETURN_IF_ERROR(request.sampling.validate(config.vocab_size));
  if (request.sampling.prompt_logprobs && prompt_len >= config.max_context_tokens) {
    return invalid_argument_error("prompt_logprobs: the " + std::to_string(prompt_len) +
                                  "-token prompt must fit in the context window of " +
                                  std::to_string(config.max_context_tokens) +
                                  " to be scored (it would be truncated)");
  }
  int32_t task = 0;
  if (restore_) {
    STRATA_ASSIGN_OR_RETURN(task, restore_->task_index(request.kv_task));
  }
  const Clock::time_point submitted = Clock::now();
  if (restore_) {
    // A request the queue refuses now does no remote I/O (checked again below).
    {
      std::scoped_lock lock(mutex_);
      STRATA_RETURN_IF_ERROR(queue_room());
    }
    // What another replica stored for this conversation, read here on the caller's thread.
    restore_->look_up_shared(request.prompt_token_ids,
                             {request.tenant, request.session,
                              request.sampling.prompt_logprobs.has_value()});
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    std::scoped_lock lock(mutex_);
    STRATA_RETURN_IF_ERROR(queue_room());
    for (int32_t i = 0; i < n; ++i) {
      streams.push_back(std::make_shared<RequestStream>(RequestId{next_id_++}));
    }
    inbox_.push_back(
        {std::move(request), streams.front(),
         std::vector<std::shared_ptr<RequestStream>>(streams.begin() + 1, streams.end()), submitted,
         task});
  }
  wake_.notify_all();
  return streams;
}

Status Engine::queue_room() const {
  if (stopping_) return Status(StatusCode::kUnavailable, "the engine is shutting down");
  const int64_t queued = static_cast<int64_t>(inbox_.size()) + stats_.num_waiting;
  if (queued >= options_.scheduler.max_queued_requests) {
    return resource_exhausted_error("the request queue is full (" + std::to_string(queued) +
                                    " waiting); retry later");
  }
  return Status();
}

void Engine::cancel(RequestId id) {
  {
    std::scoped_lock lock(mutex_);
    cancels_.push_back(id);
  }
  wake_.notify_all();
}

void Engine::loop() {
  while (true) {
    std::vector<Submission> inbox;
    std::vector<RequestId> cancels;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      // Idle, it still refreshes the statistics each second: the store moves items meanwhile.
      wake_.wait_for(lock, std::chrono::seconds(1), [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || scheduler_->has_work();
      });
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      stopping = stopping_;
    }
    admit(std::move(inbox));
    for (RequestId id : cancels) {
      auto it = active_.find(SeqId{id.value});
      if (it != active_.end()) {
        finish(*it->second, {}, FinishReason::kAbort);
        continue;
      }
      for (auto& [seq, active] : active_) {  // a fork not started yet
        auto fork = std::find_if(active->forks.begin(), active->forks.end(),
                                 [&](const auto& s) { return s->id() == id; });
        if (fork == active->forks.end()) continue;
        RequestOutput aborted;
        aborted.finish_reason = FinishReason::kAbort;
        (*fork)->push(std::move(aborted));
        active->forks.erase(fork);
        break;
      }
    }
    if (stopping) {
      while (!active_.empty()) finish(*active_.begin()->second, {}, FinishReason::kAbort);
      return;
    }
    if (scheduler_->has_work()) {
      step();
    } else {
      executor_->keep_alive();
    }
    refresh_stats();
  }
}

void Engine::refresh_stats() {
  std::scoped_lock lock(mutex_);
  stats_.num_waiting = static_cast<int64_t>(scheduler_->num_waiting());
  stats_.num_running = static_cast<int64_t>(scheduler_->num_running());
  stats_.peak_running = scheduler_->peak_running();
  stats_.kv_blocks_total = kv_->num_blocks();
  stats_.kv_blocks_available = kv_->num_available_blocks();
  stats_.kv_capacity_bytes = kv_->capacity_bytes();
  stats_.kv_used_bytes = kv_->used_bytes();
  stats_.prefix_lookup_tokens = kv_->prefix_stats().lookup_tokens;
  stats_.prefix_hit_tokens = kv_->prefix_stats().hit_tokens;
  stats_.prefix_evicted_blocks = kv_->num_evicted_groups();
  stats_.num_preemptions = scheduler_->num_preemptions();
  stats_.num_swap_outs = scheduler_->num_swap_outs();
  stats_.num_swapped = static_cast<int64_t>(scheduler_->num_swapped());
  stats_.kv_host_blocks_total = kv_->num_host_blocks();
  stats_.kv_host_blocks_free = kv_->num_free_host_blocks();
  stats_.leankv = executor_->leankv_counts();
  stats_.freekv = executor_->freekv_counts();
  if (restore_) static_cast<restore::RestoreStats&>(stats_) = restore_->stats();
}

void Engine::admit(std::vector<Submission> submissions) {
  const int64_t vocab = executor_->config().vocab_size;
  for (auto& [request, stream, forks, submitted, task] : submissions) {
    const SeqId seq{stream->id().value};
    std::vector<TokenId> stop_ids = request.sampling.stop_token_ids;
    if (!request.sampling.ignore_eos) {
      for (TokenId t : tokenizer_->stop_ids()) {
        if (t < vocab) stop_ids.push_back(t);
      }
    }
    auto active = std::make_unique<Active>(
        stream->id(), stream, sampling::SequenceSampler(request.sampling, vocab, request.prompt_token_ids),
        sampling::StopChecker(request.sampling), tokenizer::StreamDecoder(*tokenizer_),
        std::move(stop_ids), submitted);
    active->forced = std::move(request.forced_completion);
    active->compress_kv = request.compress_kv;
    active->forks = std::move(forks);
    std::vector<TokenId>& prompt = request.prompt_token_ids;
    active->usage.prompt_tokens = static_cast<int64_t>(prompt.size());
    const bool scores_prompt = request.sampling.prompt_logprobs.has_value();
    if (scores_prompt) active->prompt_logprobs.resize(std::max<size_t>(prompt.size(), 1) - 1);
    std::optional<store::StoreMatch> match;
    if (restore_) {
      match =
          restore_->look_up(seq, prompt, {request.tenant, request.session, scores_prompt, task});
    }
    const int64_t drop = tokens_to_drop(prompt, match);
    if (drop > 0) {
      const int64_t block = kv_->geometry().block_size_tokens;
      prompt.erase(prompt.begin() + block, prompt.begin() + block + drop);
      active->usage.truncated_prompt_tokens = drop;
    }
    Status added =
        scheduler_->add(seq, std::move(prompt), request.priority, std::move(request.tenant),
                        /*cacheable=*/!scores_prompt, layout_);
    Active& ref = *active;
    active_.emplace(seq, std::move(active));
    if (!added.ok()) {
      finish(ref, {}, FinishReason::kError, added.message());
    } else if (restore_) {
      restore_->admitted(seq, drop, match);
    }
  }
}

int64_t Engine::tokens_to_drop(std::span<const TokenId> prompt,
                               const std::optional<store::StoreMatch>& match) const {
  const double fraction = options_.scheduler.overflow_truncation_fraction;
  const int64_t block = kv_->geometry().block_size_tokens;
  const int64_t window = executor_->config().max_context_tokens;
  const int64_t n = static_cast<int64_t>(prompt.size());
  int64_t drop = 0;
  if (fraction > 0 && n >= window) {
    const int64_t keep = static_cast<int64_t>(static_cast<double>(window) * (1 - fraction));
    drop = (n - keep + block - 1) / block * block;
  }
  // Stored KV that dropped history is reused by dropping at least as much: truncated history
  // where this deployment truncates, and what a token-dropping codec (StreamingLLM) left out
  // always. A match on the first block alone is not worth losing history for.
  if (match && !match->exact && match->num_chunks > 1 &&
      (fraction > 0 || match->skipped_chunks > 0)) {
    drop = std::max(drop, match->token_offset);
  }
  // The first block and at least one token stay.
  return std::min(drop, std::max<int64_t>(0, (n - block - 1) / block * block));
}

void Engine::build_chunks(const scheduler::ScheduledBatch& batch, executor::ForwardBatch& forward) {
  for (const scheduler::ScheduledChunk& chunk : batch.chunks) {
    const std::vector<TokenId>& tokens = kv_->tokens(chunk.seq);
    executor::SequenceChunk& c = forward.chunks.emplace_back();
    c.seq = chunk.seq;
    c.tokens.assign(tokens.begin() + chunk.start_position,
                    tokens.begin() + chunk.start_position + chunk.num_tokens);
    c.start_position = chunk.start_position;
    c.tables = kv_->tables(chunk.seq);
    c.layout = &kv_->layout(chunk.seq);
    c.logits = chunk.samples ? executor::LogitsMode::kLast : executor::LogitsMode::kNone;
    c.samples = chunk.samples;
    Active& active = *active_.at(chunk.seq);
    c.compress_kv = active.compress_kv;
    // Until the first token is out, a scored prompt needs every position's logits (a sequence
    // recomputed after preemption has them already).
    if (active.scores_prompt() && active.usage.completion_tokens == 0) {
      c.logits = executor::LogitsMode::kAll;
    }
    if (!active.prefix_hit_recorded) {
      const int64_t hit = kv_->num_prefix_hit_tokens(chunk.seq);
      active.usage.cached_prompt_tokens += hit;
      if (active.usage.cached_tier.empty() && hit > 0) active.usage.cached_tier = "gpu";
      active.prefix_hit_recorded = true;
      if (!active.scores_prompt()) {
        std::scoped_lock lock(mutex_);
        ++(hit > 0 ? stats_.pool_prefix_hits : stats_.pool_prefix_misses);
      }
    }
  }
}

void Engine::step() {
  if (restore_) restore_->before_schedule();
  scheduler::ScheduledBatch batch = scheduler_->schedule();
  // One that LeanKV's pages could not keep (its pages are free already) decodes from the pool when
  // it comes back, rather than being compressed again for the same shortage to preempt it again.
  for (SeqId seq : batch.preempted_off_pool) active_.at(seq)->compress_kv = false;
  for (SeqId seq : batch.aborted) {
    auto it = active_.find(seq);
    if (it != active_.end()) {
      finish(*it->second, {}, FinishReason::kError,
             "the sequence no longer fits in the KV cache (" +
                 std::to_string(kv_->num_blocks()) + " blocks)");
    }
  }
  executor::ForwardBatch forward;
  forward.copies = batch.copies;
  if (restore_) {
    for (const restore::LoadedPrefix& loaded : restore_->restore(batch, forward)) {
      Usage& usage = active_.at(loaded.seq)->usage;
      if (usage.loaded_prompt_tokens > 0) continue;  // counted before a preemption
      usage.loaded_prompt_tokens = loaded.tokens;
      usage.cached_prompt_tokens += loaded.tokens;
      usage.cached_tier = loaded.tier;
    }
  }
  // Block moves of the step run even when a failed load left no chunk.
  if (batch.empty() && !batch.copies.has_block_moves()) return;

  build_chunks(batch, forward);
  if (restore_) restore_->plan_copies(forward);
  const auto forward_start = Clock::now();
  StatusOr<executor::ForwardResult> result = executor_->forward(forward);
  const double forward_seconds =
      std::chrono::duration<double>(Clock::now() - forward_start).count();
  if (restore_) restore_->after_pass(forward, result.ok() ? &*result : nullptr, forward_seconds);
  if (!result.ok()) {
    for (const scheduler::ScheduledChunk& chunk : batch.chunks) {
      finish(*active_.at(chunk.seq), {}, FinishReason::kError, result.status().to_string());
    }
    return;
  }
  // A load read beside the pass that failed: the coordinator sent its sequence back to waiting,
  // to recompute its prompt; nothing of this pass is kept for it.
  const std::vector<SeqId>& failed = result->failed_loads;
  auto load_failed = [&](SeqId seq) { return std::ranges::find(failed, seq) != failed.end(); };
  for (SeqId seq : failed) {
    Usage& usage = active_.at(seq)->usage;
    usage.cached_prompt_tokens -= std::exchange(usage.loaded_prompt_tokens, 0);
    usage.cached_tier.clear();
  }
  std::erase_if(batch.chunks, [&](const auto& c) { return load_failed(c.seq); });
  scheduler_->on_batch_done(batch);
  for (SeqId seq : result->compressed) kv_->move_off_pool(seq);
  const int64_t vocab = result->vocab_size;
  for (size_t i = 0, row = 0; i < forward.chunks.size(); ++i) {
    if (load_failed(forward.chunks[i].seq)) continue;
    const scheduler::ScheduledChunk& chunk = batch.chunks[row++];
    const int64_t num_rows = result->row_offsets[i + 1] - result->row_offsets[i];
    if (num_rows == 0) continue;
    Active& active = *active_.at(chunk.seq);
    const float* rows = result->logits.data() + result->row_offsets[i] * vocab;
    if (forward.chunks[i].logits == executor::LogitsMode::kAll) {
      record_prompt_logprobs(active, chunk.start_position, rows, num_rows, vocab);
    }
    if (!chunk.samples) continue;
    const std::span<const float> last(rows + (num_rows - 1) * vocab, vocab);  // the next token's
    if (!active.forks.empty()) start_forks(active, last);
    if (active.forced.empty()) {
      emit_token(active, active.sampler.sample(last));
    } else {
      TokenOutput forced = score_token(last, active.forced[active.usage.completion_tokens],
                                       active.sampler.params().num_logprobs);
      emit_token(active, {forced.token, forced.logprob, std::move(forced.top_logprobs)});
    }
  }
  std::scoped_lock lock(mutex_);
  ++stats_.num_steps;
  stats_.forward_seconds += forward_seconds;
  stats_.collective_seconds += result->collective_seconds;
}

}  // namespace strata::engine
