#include "strata/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>

#include "strata/common/check.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/kv/prefix_hash.h"
#include "strata/model/model_source.h"
#include "strata/sampling/stop_checker.h"
#include "strata/tokenizer/tokenizer.h"
#include "xxhash.h"

namespace strata::engine {

using Clock = std::chrono::steady_clock;

namespace {

// The name a session's KV goes by in the store, which persists it on disk: a digest, so the
// journal holds no API key or client-chosen id.
std::string store_session_key(const std::string& session) {
  if (session.empty()) return {};
  const XXH128_hash_t h = XXH3_128bits(session.data(), session.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

// The raw logprob of `target` under one row of logits, with the `num_top` most likely tokens
// (descending, lowest id first among equals).
TokenOutput score_token(std::span<const float> logits, TokenId target, int32_t num_top) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  const double log_z = max + std::log(sum);
  TokenOutput out{target, static_cast<float>(logits[target] - log_z), {}};
  if (num_top > 0) {
    std::vector<TokenId> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<TokenId>(i);
    const auto top = ids.begin() + std::min<size_t>(num_top, ids.size());
    std::partial_sort(ids.begin(), top, ids.end(), [&](TokenId a, TokenId b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (auto it = ids.begin(); it != top; ++it) {
      out.top_logprobs.push_back({*it, static_cast<float>(logits[*it] - log_z)});
    }
  }
  return out;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

std::optional<RequestOutput> RequestStream::next() {
  RequestOutput out;
  while (true) {
    switch (next_for(std::chrono::hours(1), &out)) {
      case Wait::kOutput: return out;
      case Wait::kEnd: return std::nullopt;
      case Wait::kTimeout: break;
    }
  }
}

RequestStream::Wait RequestStream::next_for(std::chrono::milliseconds timeout,
                                            RequestOutput* out) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !queue_.empty() || drained_; })) {
    return Wait::kTimeout;
  }
  if (queue_.empty()) return Wait::kEnd;
  *out = std::move(queue_.front());
  queue_.pop_front();
  if (closed_ && queue_.empty()) drained_ = true;
  return Wait::kOutput;
}

void RequestStream::push(RequestOutput output) {
  {
    std::scoped_lock lock(mutex_);
    STRATA_CHECK(!closed_) << "delta pushed after the final one";
    closed_ = output.finish_reason.has_value();
    queue_.push_back(std::move(output));
  }
  ready_.notify_all();
}

// A request in flight (step-loop thread only).
struct Engine::Active {
  RequestId id;
  std::shared_ptr<RequestStream> stream;
  sampling::SequenceSampler sampler;
  sampling::StopChecker stop_checker;
  tokenizer::StreamDecoder decoder;
  std::vector<TokenId> stop_ids;  // tokens that end generation
  Clock::time_point submitted;
  Usage usage;
  bool prefix_hit_recorded = false;
  std::string tenant;
  std::string session;  // store_session_key() of the request's session
  int64_t dropped_tokens = 0;  // prompt tokens dropped after the first block (context overflow)
  // What its first commit loads: the store item, and for each leading token block of the
  // sequence the item's chunk holding it.
  struct StoredPrefix {
    store::ItemId item = 0;
    std::vector<int64_t> chunks;
  };
  std::optional<StoredPrefix> stored;
  // Its stored chunks, pinned while it waits because the executor pre-loaded their first layers.
  std::optional<store::StoreLease> preloaded;
  // KvStore::num_publications() when it last looked its prompt up; a failed load stops lookups.
  int64_t store_lookup_at = 0;
  bool store_load_failed = false;
  // This turn's save (CachedAttention's asynchronous saving): each token block is copied out layer
  // by layer by the forward pass that completes it (blocks already resident when the save starts,
  // by the next pass) into chunks the store reserved, published when the turn ends.
  struct Saving {
    store::SaveTicket ticket;
    std::vector<kv::ChunkHash> chain;  // hashes of the sequence's blocks [0, chain.size())
    int64_t written = 0;               // destinations handed to forward passes
    bool capped = false;               // the store had no room for more: the save ends there
    std::vector<std::function<void()>> copies;  // device-to-host copies that may be in flight
    double seconds = 0;                         // executor time on its copies
  };
  std::optional<Saving> saving;
  // With SamplingParams::prompt_logprobs: entry i scores prompt token i + 1; sent with the first
  // token.
  std::vector<TokenOutput> prompt_logprobs;
  bool scores_prompt() const { return sampler.params().prompt_logprobs.has_value(); }
  // Scored prompts are not stored; truncated history is found by session only.
  bool saves_kv() const { return !scores_prompt() && (dropped_tokens == 0 || !session.empty()); }
};

StatusOr<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<model::ModelSource> source,
                                                 std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                                                 const EngineOptions& options) {
  STRATA_RETURN_IF_ERROR(options.scheduler.validate());
  if (!(options.overflow_truncation_fraction >= 0 && options.overflow_truncation_fraction <= 0.9)) {
    return invalid_argument_error("overflow_truncation_fraction must be in [0, 0.9], got " +
                                  std::to_string(options.overflow_truncation_fraction));
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
  STRATA_ASSIGN_OR_RETURN(executor_, executor::Executor::create(*source_, options_.executor));
  executor_->init_calling_thread();
  // The fingerprint keeps cached KV of different models (or weights) apart.
  const model::ModelConfig& c = source_->config();
  model_fingerprint_ = std::hash<std::string>{}(
      source_->path() + "|" + c.name + "|" + std::to_string(c.num_layers) + "|" +
      std::to_string(c.hidden_size) + "|" + std::to_string(c.vocab_size));
  kv_ = std::make_unique<kv::KvCacheManager>(
      executor_->kv_geometry(), executor_->kv_format(),
      kv::PrefixCacheOptions{options_.enable_prefix_caching, model_fingerprint_});
  scheduler_ = std::make_unique<scheduler::Scheduler>(options_.scheduler, *kv_);
  if (options_.store) {
    store::StoreOptions store = *options_.store;
    store.chunk_bytes = executor_->kv_chunk_bytes();
    store.block_size_tokens = executor_->kv_geometry().block_size_tokens;
    // Chunks are interchangeable only between engines of one model, pool format and geometry.
    const kv::BlockFormat format = executor_->kv_format();
    store.layout_tag = std::hash<std::string>{}(
        std::to_string(model_fingerprint_) + "|" + std::to_string(static_cast<int>(format.key)) +
        "|" + std::to_string(static_cast<int>(format.value)) + "|" +
        std::to_string(store.block_size_tokens) + "|" + std::to_string(store.chunk_bytes));
    const executor::Executor* executor = executor_.get();
    store.register_host_memory = [executor](void* data, size_t bytes) {
      executor->register_host_memory(data, bytes);
    };
    store.unregister_host_memory = [executor](void* data) {
      executor->unregister_host_memory(data);
    };
    STRATA_ASSIGN_OR_RETURN(store_, store::KvStore::open(store));
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
  return store_ != nullptr && !session.empty() && store_->erase_session(store_session_key(session));
}

EngineStats Engine::stats() const {
  std::scoped_lock lock(mutex_);
  return stats_;
}

StatusOr<std::shared_ptr<RequestStream>> Engine::submit(GenerateRequest request) {
  const model::ModelConfig& config = executor_->config();
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
  if (prompt_len >= config.max_context_tokens && options_.overflow_truncation_fraction == 0) {
    return invalid_argument_error("prompt: " + std::to_string(prompt_len) +
                                  " tokens leave no room in the context window of " +
                                  std::to_string(config.max_context_tokens));
  }
  STRATA_RETURN_IF_ERROR(request.sampling.validate(config.vocab_size));
  if (request.sampling.prompt_logprobs && prompt_len >= config.max_context_tokens) {
    return invalid_argument_error("prompt_logprobs: the " + std::to_string(prompt_len) +
                                  "-token prompt must fit in the context window of " +
                                  std::to_string(config.max_context_tokens) +
                                  " to be scored (it would be truncated)");
  }
  std::shared_ptr<RequestStream> stream;
  {
    std::scoped_lock lock(mutex_);
    if (stopping_) return Status(StatusCode::kUnavailable, "the engine is shutting down");
    const int64_t queued = static_cast<int64_t>(inbox_.size()) + stats_.num_waiting;
    if (queued >= options_.max_queued_requests) {
      return resource_exhausted_error("the request queue is full (" + std::to_string(queued) +
                                      " waiting); retry later");
    }
    stream = std::make_shared<RequestStream>(RequestId{next_id_++});
    inbox_.emplace_back(std::move(request), stream);
  }
  wake_.notify_all();
  return stream;
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
    std::vector<std::pair<GenerateRequest, std::shared_ptr<RequestStream>>> inbox;
    std::vector<RequestId> cancels;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || scheduler_->has_work();
      });
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      stopping = stopping_;
    }
    admit(std::move(inbox));
    for (RequestId id : cancels) {
      auto it = active_.find(SeqId{id.value});
      if (it != active_.end()) finish(*it->second, {}, FinishReason::kAbort);
    }
    if (stopping) {
      while (!active_.empty()) finish(*active_.begin()->second, {}, FinishReason::kAbort);
      return;
    }
    if (scheduler_->has_work()) step();
    refresh_stats();
  }
}

void Engine::refresh_stats() {
  std::scoped_lock lock(mutex_);
  stats_.num_waiting = static_cast<int64_t>(scheduler_->num_waiting());
  stats_.num_running = static_cast<int64_t>(scheduler_->num_running());
  stats_.kv_blocks_total = kv_->num_blocks();
  stats_.kv_blocks_available = kv_->num_available_blocks();
  stats_.prefix_lookup_tokens = kv_->prefix_stats().lookup_tokens;
  stats_.prefix_hit_tokens = kv_->prefix_stats().hit_tokens;
  stats_.prefix_evicted_blocks = kv_->num_evicted_groups();
  stats_.num_preemptions = scheduler_->num_preemptions();
  stats_.num_swap_outs = scheduler_->num_swap_outs();
  stats_.num_swapped = static_cast<int64_t>(scheduler_->num_swapped());
  stats_.kv_host_blocks_total = kv_->num_host_blocks();
  stats_.kv_host_blocks_free = kv_->num_free_host_blocks();
  if (store_) stats_.store = store_->stats();
}

void Engine::admit(std::vector<std::pair<GenerateRequest, std::shared_ptr<RequestStream>>> requests) {
  const int64_t vocab = executor_->config().vocab_size;
  for (auto& [request, stream] : requests) {
    const SeqId seq{stream->id().value};
    std::vector<TokenId> stop_ids = request.sampling.stop_token_ids;
    if (!request.sampling.ignore_eos) {
      for (TokenId t : tokenizer_->stop_ids()) {
        if (t < vocab) stop_ids.push_back(t);
      }
    }
    auto active = std::unique_ptr<Active>(
        new Active{stream->id(),
                   stream,
                   sampling::SequenceSampler(request.sampling, vocab, request.prompt_token_ids),
                   sampling::StopChecker(request.sampling),
                   tokenizer::StreamDecoder(*tokenizer_),
                   std::move(stop_ids),
                   Clock::now(),
                   {},
                   false,
                   request.tenant,
                   store_session_key(request.session),
                   0,
                   std::nullopt,
                   std::nullopt,
                   0,
                   false,
                   std::nullopt,
                   {}});
    std::vector<TokenId>& prompt = request.prompt_token_ids;
    active->usage.prompt_tokens = static_cast<int64_t>(prompt.size());
    std::optional<store::StoreMatch> match;
    const bool scores_prompt = request.sampling.prompt_logprobs.has_value();
    if (scores_prompt) {
      active->prompt_logprobs.resize(std::max<size_t>(prompt.size(), 1) - 1);
    } else if (store_) {
      active->store_lookup_at = store_->num_publications();
      match = store_->find(prompt, store_root(request.tenant), active->session);
    }
    const int64_t drop = tokens_to_drop(prompt, match);
    if (drop > 0) {
      const int64_t block = kv_->geometry().block_size_tokens;
      prompt.erase(prompt.begin() + block, prompt.begin() + block + drop);
      active->dropped_tokens = drop;
      active->usage.truncated_prompt_tokens = drop;
    }
    Status added = scheduler_->add(seq, std::move(prompt), request.priority,
                                   std::move(request.tenant), /*cacheable=*/!scores_prompt);
    Active& ref = *active;
    active_.emplace(seq, std::move(active));
    if (!added.ok()) {
      finish(ref, {}, FinishReason::kError, added.message());
    } else if (match) {
      attach_stored_prefix(ref, *match);
    }
  }
}

kv::ChunkHash Engine::store_root(const std::string& tenant) const {
  return kv::prefix_root(model_fingerprint_, kv_->format(), kv_->geometry().block_size_tokens,
                         tenant);
}

int64_t Engine::tokens_to_drop(std::span<const TokenId> prompt,
                               const std::optional<store::StoreMatch>& match) const {
  const double fraction = options_.overflow_truncation_fraction;
  if (fraction == 0) return 0;
  const int64_t block = kv_->geometry().block_size_tokens;
  const int64_t window = executor_->config().max_context_tokens;
  const int64_t n = static_cast<int64_t>(prompt.size());
  int64_t drop = 0;
  if (n >= window) {
    const int64_t keep = static_cast<int64_t>(static_cast<double>(window) * (1 - fraction));
    drop = (n - keep + block - 1) / block * block;
  }
  // A session whose stored KV dropped history keeps dropping at least as much, to reuse it;
  // a match on the first block alone is not worth losing history for.
  if (match && !match->exact && match->num_chunks > 1) drop = std::max(drop, match->token_offset);
  // The first block and at least one token stay.
  return std::min(drop, std::max<int64_t>(0, (n - block - 1) / block * block));
}

void Engine::attach_stored_prefix(Active& active, const store::StoreMatch& match) {
  const int64_t stored_drop = match.exact ? 0 : match.token_offset;
  // Truncation only grows, in whole blocks: the sequence's block j >= 1 is the item's chunk
  // j + shift.
  const int64_t shift =
      (active.dropped_tokens - stored_drop) / kv_->geometry().block_size_tokens;
  if (shift < 0 || match.num_chunks == 0) return;
  Active::StoredPrefix stored{match.item, {0}};
  for (int64_t chunk = 1 + shift; chunk < match.num_chunks; ++chunk) stored.chunks.push_back(chunk);
  kv_->set_external_prefix(SeqId{active.id.value}, static_cast<int64_t>(stored.chunks.size()),
                           /*exact=*/active.dropped_tokens == 0);
  active.stored = std::move(stored);
}

std::vector<store::StoreLease> Engine::acquire_loads(scheduler::ScheduledBatch& batch,
                                                     executor::ForwardBatch& forward) {
  std::vector<store::StoreLease> leases;
  const int64_t block = kv_->geometry().block_size_tokens;
  for (const kv::BlockLoad& load : batch.copies.loads) {
    Active& active = *active_.at(load.seq);
    STRATA_CHECK(active.stored.has_value()) << "a load for a sequence without a stored item";
    const Active::StoredPrefix stored = *std::move(active.stored);
    active.stored.reset();
    // Pin the chunks of blocks [first_block, first_block + num_blocks), one lease per run of
    // consecutive chunks.
    executor::KvLoad kv_load{load.seq, load.first_block, {}};
    std::vector<store::StoreLease> pinned;
    std::optional<Status> failure;
    bool from_ssd = false;
    if (active.preloaded) {
      // Pinned since its pre-load: chunk i of the lease holds block i.
      const std::vector<const std::byte*>& held = active.preloaded->chunks;
      kv_load.chunks.assign(held.begin() + load.first_block,
                            held.begin() + load.first_block + load.num_blocks);
      pinned.push_back(*std::move(active.preloaded));
      active.preloaded.reset();
    }
    for (int64_t j = load.first_block + std::ssize(kv_load.chunks);
         j < load.first_block + load.num_blocks;) {
      int64_t run = 1;
      while (j + run < load.first_block + load.num_blocks &&
             stored.chunks[j + run] == stored.chunks[j] + run) {
        ++run;
      }
      StatusOr<store::StoreLease> lease = store_->acquire(stored.item, stored.chunks[j], run);
      if (!lease.ok()) {
        failure = lease.status();
        break;
      }
      from_ssd = from_ssd || lease->served_from == store::Tier::kSsd;
      kv_load.chunks.insert(kv_load.chunks.end(), lease->chunks.begin(), lease->chunks.end());
      pinned.push_back(*std::move(lease));
      j += run;
    }
    if (failure) {
      // The chunks vanished or failed their checksums (the store dropped the item), or DRAM had
      // no room to read them into now: compute the prompt.
      for (const store::StoreLease& lease : pinned) store_->release(lease, 0);
      scheduler_->restart(load.seq);
      active.store_load_failed = true;
      std::erase_if(batch.chunks, [&](const scheduler::ScheduledChunk& c) {
        return c.seq == load.seq;
      });
      std::scoped_lock lock(mutex_);
      ++(failure->code() == StatusCode::kUnavailable ? stats_.store_loads_skipped
                                                     : stats_.store_load_failures);
      continue;
    }
    const int64_t tokens = load.num_blocks * block;
    Usage& usage = active.usage;
    if (usage.loaded_prompt_tokens == 0) {  // not again after a preemption
      usage.loaded_prompt_tokens = tokens;
      usage.cached_prompt_tokens += tokens;
      usage.cached_tier = from_ssd ? "ssd" : "dram";
    }
    {
      std::scoped_lock lock(mutex_);
      (from_ssd ? stats_.store_loaded_tokens_ssd : stats_.store_loaded_tokens_dram) += tokens;
    }
    forward.loads.push_back(std::move(kv_load));
    leases.insert(leases.end(), std::make_move_iterator(pinned.begin()),
                  std::make_move_iterator(pinned.end()));
  }
  return leases;
}

void Engine::look_up_queue_head() {
  const int64_t publications = store_->num_publications();
  const int64_t depth = std::min<int64_t>(options_.scheduler.max_num_seqs, kQueueLookupDepth);
  int64_t seen = 0;
  for (SeqId seq : scheduler_->waiting()) {
    if (seen++ == depth) return;
    Active& active = *active_.at(seq);
    // Truncated prompts and scored ones do not change what they load; a sequence holding blocks
    // (swapped, or admitted earlier) is past its first commit.
    if (active.stored || active.store_lookup_at == publications || active.store_load_failed ||
        active.dropped_tokens > 0 || active.scores_prompt() || kv_->is_swapped(seq) ||
        !kv_->tables(seq).empty()) {
      continue;
    }
    active.store_lookup_at = publications;
    if (std::optional<store::StoreMatch> match =
            store_->find(kv_->tokens(seq), store_root(active.tenant), active.session);
        match && match->exact) {
      attach_stored_prefix(active, *match);
    }
  }
}

void Engine::plan_preload(executor::ForwardBatch& forward) {
  if (options_.read_buffer_layers == 0) return;
  for (SeqId seq : scheduler_->waiting()) {
    Active& active = *active_.at(seq);
    if (!active.stored) continue;
    if (active.preloaded) return;  // the read buffer holds the next request already
    // A truncated prefix (chunks not consecutive) loads as usual.
    const std::vector<int64_t>& chunks = active.stored->chunks;
    if (chunks.back() - chunks.front() + 1 != std::ssize(chunks) || chunks.front() != 0) return;
    std::optional<store::StoreLease> lease =
        store_->try_acquire_in_dram(active.stored->item, 0, std::ssize(chunks));
    if (!lease) return;  // still on SSD (a prefetch may bring it) or being moved
    const int64_t block = kv_->geometry().block_size_tokens;
    const int64_t layers =
        preload_layers(std::ssize(chunks), active.usage.prompt_tokens - std::ssize(chunks) * block);
    forward.preloads.push_back({seq, lease->chunks, layers});
    active.preloaded = std::move(lease);
    std::scoped_lock lock(mutex_);
    ++stats_.preloads;
    stats_.preloaded_layers += layers;
    return;
  }
}

int64_t Engine::preload_layers(int64_t chunks, int64_t new_tokens) const {
  const int64_t num_layers = executor_->config().num_layers;
  if (options_.read_buffer_layers > 0) return std::min(options_.read_buffer_layers, num_layers);
  // Unmeasured yet: half the layers.
  if (load_bytes_per_second_ <= 0 || prefill_seconds_per_token_layer_ <= 0) {
    return std::max<int64_t>(1, num_layers / 2);
  }
  const double t_load = static_cast<double>(chunks * executor_->kv_chunk_bytes()) /
                        static_cast<double>(num_layers) / load_bytes_per_second_;
  const double t_compute =
      static_cast<double>(std::max<int64_t>(new_tokens, 1)) * prefill_seconds_per_token_layer_;
  return store::read_buffer_layers(num_layers, t_compute, t_load);
}

void Engine::plan_saves(executor::ForwardBatch& forward) {
  const int64_t block = kv_->geometry().block_size_tokens;
  for (const executor::SequenceChunk& chunk : forward.chunks) {
    Active& active = *active_.at(chunk.seq);
    if (!active.saves_kv()) continue;
    const std::vector<TokenId>& tokens = kv_->tokens(chunk.seq);
    const auto end_block =
        (chunk.start_position + static_cast<int64_t>(chunk.tokens.size())) / block;
    auto hash_up_to = [&](std::vector<kv::ChunkHash>& chain, int64_t blocks) {
      kv::ChunkHash hash = chain.empty() ? store_root(active.tenant) : chain.back();
      for (auto b = static_cast<int64_t>(chain.size()); b < blocks; ++b) {
        hash = kv::chain_hash(hash, std::span<const TokenId>(tokens).subspan(b * block, block));
        chain.push_back(hash);
      }
    };
    if (!active.saving) {
      // Starts with the first pass that completes a block, reserving every full block the
      // sequence has (the prompt's, computed over this and the next passes).
      if (end_block == 0) continue;
      Active::Saving saving;
      hash_up_to(saving.chain, static_cast<int64_t>(tokens.size()) / block);
      StatusOr<store::SaveTicket> ticket = store_->begin_save(
          {active.session, active.dropped_tokens == 0, active.dropped_tokens, saving.chain});
      if (ticket.ok()) {
        saving.ticket = *std::move(ticket);
      } else {
        saving.capped = true;  // no DRAM room now (counted by the store)
      }
      active.saving = std::move(saving);
    }
    Active::Saving& saving = *active.saving;
    store::SaveTicket& ticket = saving.ticket;
    int64_t reserved_end = ticket.first_chunk + static_cast<int64_t>(ticket.destinations.size());
    if (!saving.capped && end_block > reserved_end) {
      hash_up_to(saving.chain, end_block);
      const int64_t wanted = end_block - reserved_end;
      const int64_t got = store_->extend_save(
          &ticket, std::span<const kv::ChunkHash>(saving.chain).subspan(reserved_end, wanted));
      saving.capped = got < wanted;
      reserved_end += got;
    }
    const int64_t first = ticket.first_chunk + saving.written;
    const int64_t count = std::min(end_block, reserved_end) - first;
    if (count <= 0) continue;
    executor::KvSave& save = forward.saves.emplace_back();
    save.seq = chunk.seq;
    save.first_block = first;
    save.chunks.assign(ticket.destinations.begin() + saving.written,
                       ticket.destinations.begin() + saving.written + count);
    saving.written += count;
  }
}

void Engine::account_pass(const executor::ForwardBatch& forward,
                          const executor::ForwardResult& result, double seconds) {
  const int64_t chunk_bytes = executor_->kv_chunk_bytes();
  int64_t loaded = 0, saved = 0, tokens = 0;
  for (const executor::KvLoad& load : forward.loads) loaded += std::ssize(load.chunks);
  for (const executor::KvSave& save : forward.saves) saved += std::ssize(save.chunks);
  for (const executor::SequenceChunk& chunk : forward.chunks) tokens += std::ssize(chunk.tokens);
  for (const executor::KvSave& save : forward.saves) {
    Active::Saving& saving = *active_.at(save.seq)->saving;
    if (result.saves_written) saving.copies.push_back(result.saves_written);
    saving.seconds += result.save_seconds * static_cast<double>(std::ssize(save.chunks)) /
                      static_cast<double>(saved);
  }
  // Moving averages that size the read buffer.
  constexpr double kWeight = 0.2;  // of the newest sample
  auto update = [&](double& average, double sample) {
    average = average > 0 ? (1 - kWeight) * average + kWeight * sample : sample;
  };
  if (loaded > 0 && result.load_copy_seconds > 0) {
    update(load_bytes_per_second_,
           static_cast<double>(loaded * chunk_bytes) / result.load_copy_seconds);
  }
  // Prefill-sized passes only: a few decode tokens measure the per-pass overhead instead.
  constexpr int64_t kMinPrefillTokens = 64;
  if (tokens >= kMinPrefillTokens) {
    update(prefill_seconds_per_token_layer_,
           seconds / static_cast<double>(tokens * executor_->config().num_layers));
  }
  std::scoped_lock lock(mutex_);
  if (loaded > 0) {
    stats_.pool_bytes_loaded += loaded * chunk_bytes;
    stats_.pool_load_seconds += result.load_seconds;
    ++stats_.pool_loads;
  }
  if (saved > 0) {
    stats_.pool_bytes_saved += saved * chunk_bytes;
    stats_.pool_save_seconds += result.save_seconds;
    ++stats_.pool_saves;
  }
}

void Engine::release_preload(Active& active) {
  if (!active.preloaded) return;
  store_->release(*active.preloaded, 0);
  active.preloaded.reset();
  executor_->drop_preload(SeqId{active.id.value});
}

void Engine::end_save(Active& active, bool publish) {
  if (!active.saving) return;
  Active::Saving saving = *std::move(active.saving);
  active.saving.reset();
  store::SaveTicket& ticket = saving.ticket;
  // A finished turn has computed every block it reserved; anything else gives the chunks back,
  // after the copies into them are done.
  if (!publish || saving.written != static_cast<int64_t>(ticket.destinations.size())) {
    for (const auto& wait : saving.copies) wait();
    store_->abort_save(ticket);
    return;
  }
  {
    std::scoped_lock lock(mutex_);
    stats_.store_saved_tokens +=
        static_cast<int64_t>(ticket.destinations.size()) * kv_->geometry().block_size_tokens;
  }
  std::function<void()> wait;
  if (!saving.copies.empty()) {
    wait = [copies = std::move(saving.copies)] {
      for (const auto& c : copies) c();
    };
  }
  store_->commit_save(std::move(ticket), std::move(wait), saving.seconds);
}

void Engine::record_prompt_logprobs(Active& active, int64_t start_position, const float* logits,
                                    int64_t num_rows, int64_t vocab) {
  const std::vector<TokenId>& tokens = kv_->tokens(SeqId{active.id.value});
  const int32_t num_top = *active.sampler.params().prompt_logprobs;
  // Row r is the distribution after position start_position + r: it scores the token after it.
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t target = start_position + r + 1;
    if (target >= active.usage.prompt_tokens) break;
    active.prompt_logprobs[target - 1] =
        score_token(std::span<const float>(logits + r * vocab, vocab), tokens[target], num_top);
  }
}

void Engine::publish_store_queue() {
  std::vector<store::ItemId> queue;
  for (SeqId seq : scheduler_->waiting()) {
    const Active& active = *active_.at(seq);
    if (active.stored) queue.push_back(active.stored->item);
  }
  if (queue == store_queue_) return;
  store_queue_ = queue;
  store_->set_queue(std::move(queue));
}

void Engine::finish(Active& active, RequestOutput output, FinishReason reason, std::string error) {
  output.finish_reason = reason;
  output.error = std::move(error);
  output.usage = active.usage;
  const SeqId seq{active.id.value};
  end_save(active, reason == FinishReason::kStop || reason == FinishReason::kLength);
  release_preload(active);
  active.stream->push(std::move(output));
  scheduler_->remove(seq);
  active_.erase(seq);  // destroys `active`
}

void Engine::emit_token(Active& active, const sampling::SampleResult& sample) {
  const SeqId seq{active.id.value};
  active.sampler.accept(sample.token);
  kv_->append_tokens(seq, std::vector<TokenId>{sample.token});
  Usage& usage = active.usage;
  if (usage.completion_tokens++ == 0) {
    usage.time_to_first_token_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - active.submitted).count();
  }
  RequestOutput out;
  out.tokens.push_back({sample.token, sample.logprob, sample.top_logprobs});
  if (usage.completion_tokens == 1) out.prompt_logprobs = std::move(active.prompt_logprobs);
  const sampling::SamplingParams& params = active.sampler.params();
  const bool is_stop_token = std::find(active.stop_ids.begin(), active.stop_ids.end(),
                                       sample.token) != active.stop_ids.end();
  if (!is_stop_token) {
    sampling::StopCheckResult checked = active.stop_checker.append(active.decoder.push(sample.token));
    out.text = std::move(checked.text);
    if (checked.stopped()) return finish(active, std::move(out), FinishReason::kStop);
  }
  const bool at_max_tokens = usage.completion_tokens >= params.max_tokens;
  const bool context_full = static_cast<int64_t>(kv_->tokens(seq).size()) >=
                            executor_->config().max_context_tokens;
  if (is_stop_token || at_max_tokens || context_full) {
    // Whatever the decoder and stop checker held back is final now.
    sampling::StopCheckResult rest = active.stop_checker.append(active.decoder.flush());
    out.text += rest.text;
    if (!rest.stopped()) out.text += active.stop_checker.flush();
    const FinishReason reason =
        is_stop_token || rest.stopped() ? FinishReason::kStop : FinishReason::kLength;
    return finish(active, std::move(out), reason);
  }
  out.usage = usage;
  active.stream->push(std::move(out));
}

void Engine::step() {
  if (store_) look_up_queue_head();
  scheduler::ScheduledBatch batch = scheduler_->schedule();
  for (SeqId seq : batch.aborted) {
    auto it = active_.find(seq);
    if (it != active_.end()) {
      finish(*it->second, {}, FinishReason::kError,
             "the sequence no longer fits in the KV cache (" +
                 std::to_string(kv_->num_blocks()) + " blocks)");
    }
  }
  if (store_) {
    // A sequence preempted to recompute lost its blocks: it may load its prefix again (unless
    // truncated: that one computes).
    for (SeqId seq : batch.preempted) {
      Active& active = *active_.at(seq);
      active.stored.reset();
      // Swapped out, or already admitted again in this step (it holds blocks), or truncated, or
      // scoring its prompt (which is always computed).
      if (kv_->is_swapped(seq) || !kv_->tables(seq).empty() || active.dropped_tokens > 0 ||
          active.scores_prompt()) {
        continue;
      }
      if (std::optional<store::StoreMatch> match =
              store_->find(kv_->tokens(seq), store_root(active.tenant), active.session);
          match && match->exact) {
        attach_stored_prefix(active, *match);
      }
    }
  }
  executor::ForwardBatch forward;
  forward.copies = batch.copies;
  const std::vector<store::StoreLease> leases =
      store_ ? acquire_loads(batch, forward) : std::vector<store::StoreLease>{};
  if (store_) publish_store_queue();
  // Block moves of the step run even when a failed load left no chunk.
  if (batch.empty() && !batch.copies.has_block_moves()) return;

  for (const scheduler::ScheduledChunk& chunk : batch.chunks) {
    const std::vector<TokenId>& tokens = kv_->tokens(chunk.seq);
    executor::SequenceChunk& c = forward.chunks.emplace_back();
    c.seq = chunk.seq;
    c.tokens.assign(tokens.begin() + chunk.start_position,
                    tokens.begin() + chunk.start_position + chunk.num_tokens);
    c.start_position = chunk.start_position;
    c.tables = kv_->tables(chunk.seq);
    c.logits = chunk.samples ? executor::LogitsMode::kLast : executor::LogitsMode::kNone;
    Active& active = *active_.at(chunk.seq);
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
  if (store_) {
    plan_saves(forward);
    plan_preload(forward);
  }
  const auto forward_start = Clock::now();
  StatusOr<executor::ForwardResult> result = executor_->forward(forward);
  const double forward_seconds =
      std::chrono::duration<double>(Clock::now() - forward_start).count();
  for (const store::StoreLease& lease : leases) {
    store_->release(lease, result.ok() ? result->load_seconds / leases.size() : 0.0);
  }
  // A request that ran keeps no pre-load (the pass used or dropped it).
  for (const executor::SequenceChunk& chunk : forward.chunks)
    release_preload(*active_.at(chunk.seq));
  if (result.ok() && store_) account_pass(forward, *result, forward_seconds);
  if (!result.ok()) {
    for (const scheduler::ScheduledChunk& chunk : batch.chunks) {
      finish(*active_.at(chunk.seq), {}, FinishReason::kError, result.status().to_string());
    }
    return;
  }
  scheduler_->on_batch_done(batch);
  const int64_t vocab = result->vocab_size;
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    const scheduler::ScheduledChunk& chunk = batch.chunks[i];
    const int64_t num_rows = result->row_offsets[i + 1] - result->row_offsets[i];
    if (num_rows == 0) continue;
    Active& active = *active_.at(chunk.seq);
    const float* rows = result->logits.data() + result->row_offsets[i] * vocab;
    if (forward.chunks[i].logits == executor::LogitsMode::kAll) {
      record_prompt_logprobs(active, chunk.start_position, rows, num_rows, vocab);
    }
    if (!chunk.samples) continue;
    const float* last = rows + (num_rows - 1) * vocab;  // the distribution of the next token
    emit_token(active, active.sampler.sample(std::span<const float>(last, vocab)));
  }
  std::scoped_lock lock(mutex_);
  ++stats_.num_steps;
}

}  // namespace strata::engine
