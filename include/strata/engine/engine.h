// The engine: a thread-safe facade that owns the model, tokenizer, executor, KV cache manager and
// scheduler, and runs one background step loop. Clients submit requests and read a stream of
// deltas (tokens, text, finish reason, usage); cancel() frees a request's KV at once.
//
// Each request is one sequence today (SeqId == RequestId). Text is detokenized incrementally:
// a delta carries only complete UTF-8, never a partial stop string, and never the text of a stop
// token.
//
// With a KV store (EngineOptions::store, CachedAttention), the restore coordinator
// (restore/restore_coordinator.h) decides what each request loads and saves: a request saves the
// KV of its full token blocks as it computes them and publishes them when it finishes with kStop
// or kLength, under its session key and the chained content hash of its tokens; a later request
// whose prompt starts with those tokens (the next turn of the conversation) loads them instead of
// computing them. Tiers, nearest first: the device pool's prefix cache, host DRAM, SSD. A load
// that fails (a corrupt or vanished chunk, or no DRAM room to read it into) sends the request back
// to the queue to recompute its whole prompt, and is counted.
//
// A request with SamplingParams::prompt_logprobs computes its whole prompt (no prefix cache, no
// store, no truncation) with logits at every position, and gets the prompt's logprobs with its
// first token: how perplexity and loglikelihood scoring are measured.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/engine/engine_config.h"
#include "strata/executor/executor.h"
#include "strata/model/model_config.h"
#include "strata/restore/restore_coordinator.h"
#include "strata/sampling/sampler.h"
#include "strata/sampling/sampling_params.h"
#include "strata/scheduler/scheduler.h"
#include "strata/store/kv_store.h"
#include "strata/store/store_config.h"

namespace strata::model {
class ModelSource;
}
namespace strata::tokenizer {
class Tokenizer;
}

namespace strata::engine {

struct RequestId {
  uint64_t value = 0;
  auto operator<=>(const RequestId&) const = default;
};

enum class FinishReason {
  kStop,    // a stop token or stop string
  kLength,  // max_tokens or the context window
  kAbort,   // cancelled, or the engine shut down
  kError,   // failed (the output's error says why)
};
const char* finish_reason_name(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // not computed: from the prefix cache or the KV store
  int64_t loaded_prompt_tokens = 0;  // of those, loaded from the KV store
  // Dropped from the prompt's history because it filled the context window
  // (EngineOptions::overflow_truncation_fraction).
  int64_t truncated_prompt_tokens = 0;
  // The slowest tier cached tokens came from: "gpu" (the device pool's prefix cache, also on
  // the CPU), "dram" or "ssd"; empty without any.
  std::string cached_tier;
  int64_t completion_tokens = 0;
  double time_to_first_token_ms = 0;  // from submit() to the first sampled token
};

struct TokenOutput {
  TokenId token = 0;
  float logprob = 0;
  std::vector<sampling::TokenLogprob> top_logprobs;  // params.num_logprobs entries
};

// One streamed delta. The last one of a request has finish_reason set.
struct RequestOutput {
  std::vector<TokenOutput> tokens;  // tokens sampled since the previous delta
  // With SamplingParams::prompt_logprobs, in the first delta only: entry i scores prompt token
  // i + 1 (raw logprobs; the first token has nothing before it to be scored by).
  std::vector<TokenOutput> prompt_logprobs;
  std::string text;                 // text that became final since the previous delta
  std::optional<FinishReason> finish_reason;
  std::string error;  // with kError
  Usage usage;        // totals so far
};

// The receiving end of one request. Thread-safe.
class RequestStream {
 public:
  explicit RequestStream(RequestId id) : id_(id) {}
  RequestId id() const { return id_; }
  // Blocks for the next delta; nullopt after the final one has been returned.
  std::optional<RequestOutput> next();
  enum class Wait { kOutput, kTimeout, kEnd };
  // Like next(), but returns kTimeout after `timeout` without a delta (so a server thread can
  // notice a disconnected client); *out is set only with kOutput.
  Wait next_for(std::chrono::milliseconds timeout, RequestOutput* out);

  // Engine side: queue a delta (the final one closes the stream).
  void push(RequestOutput output);

 private:
  const RequestId id_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> queue_;
  bool closed_ = false;  // the final delta was pushed
  bool drained_ = false;  // ... and returned
};

struct GenerateRequest {
  std::vector<TokenId> prompt_token_ids;
  sampling::SamplingParams sampling;
  int32_t priority = 0;  // lower runs first
  std::string tenant;    // prefix-cache isolation: only requests of one tenant share cached KV
  // The conversation this turn belongs to (already tenant-qualified): the KV store keeps one item
  // per session and finds it by this key as well as by content. Empty: by content only.
  std::string session;
  // Teacher forcing: when set, step i emits forced_completion[i] instead of a sampled token, with
  // its logprob (and top logprobs) under the model's raw distribution, through the same decode
  // steps as sampled tokens; generation ends after the last one (max_tokens, stop tokens and stop
  // strings do not apply). What scores a continuation by decoding it (bench ppl
  // --decode-tokens).
  std::vector<TokenId> forced_completion;
  // false: this request's KV stays on the pool, uncompressed (LeanKV's and FreeKV's baseline), in
  // a deployment that runs LeanKV or FreeKV (leankv.enabled, freekv.enabled); no effect otherwise.
  bool compress_kv = true;
  // The task family of this request's stored KV (AdaptCache weighs an entry's codecs by its
  // family's quality curve, kv_store.adaptcache_profile); empty: the profile's default. Ignored
  // without AdaptCache.
  std::string kv_task;
};

// The deployment file's sections the engine runs from, as they are.
struct EngineOptions {
  // Also kv_cache.enable_prefix_caching and kv_cache.page_format, which the engine reads.
  executor::ExecutorOptions executor;
  SchedulingConfig scheduler;
  // The host DRAM / SSD KV store and its read buffer; off unless kv_store.enabled(). The restore
  // coordinator completes it with the executor's chunk layout (store::StoreOptions::from_config).
  store::StoreConfig kv_store;
};

// The engine's counters; what the restore coordinator did with the KV store comes first.
struct EngineStats : restore::RestoreStats {
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t peak_running = 0;  // since start: the most sequences running at once
  int64_t num_swapped = 0;
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_available = 0;  // free or evictable
  int64_t kv_capacity_bytes = 0;    // the device pool's pages
  int64_t kv_used_bytes = 0;        // of those, bytes of allocated blocks (in their formats)
  int32_t kv_host_blocks_total = 0;
  int32_t kv_host_blocks_free = 0;
  int64_t prefix_lookup_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_evicted_blocks = 0;  // cached token blocks evicted to make room
  int64_t num_preemptions = 0;  // swap-outs plus recomputes
  int64_t num_swap_outs = 0;
  int64_t num_steps = 0;
  // Wall time of the executor's forward passes, and of it the time in tensor-parallel
  // collectives (0 with one rank).
  double forward_seconds = 0;
  double collective_seconds = 0;
  // The device pool as the store's top tier: requests whose prompt found blocks in its prefix
  // cache (hits) or none (misses).
  int64_t pool_prefix_hits = 0;
  int64_t pool_prefix_misses = 0;
  executor::LeanKvCounts leankv;  // zeros unless leankv is enabled
  executor::FreeKvCounts freekv;  // zeros unless freekv is enabled
};

class Engine {
 public:
  // Builds the executor (weights + KV pool), KV manager and scheduler, and starts the step loop.
  static StatusOr<std::unique_ptr<Engine>> create(std::unique_ptr<model::ModelSource> source,
                                                  std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                                                  const EngineOptions& options);
  // Finishes every open request with kAbort and stops the loop.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. INVALID_ARGUMENT naming the field for an empty prompt, a token id outside
  // the vocabulary, a prompt that leaves no room in the context window, or invalid sampling
  // parameters; RESOURCE_EXHAUSTED when max_queued_requests are already waiting. Thread-safe.
  StatusOr<std::shared_ptr<RequestStream>> submit(GenerateRequest request);
  // n samples of one prompt (OpenAI's n): the prompt is computed once, by the first sequence;
  // when its prefill is done the others fork from it, sharing its KV pages (copy-on-write), and
  // each draws its own tokens from the same last-position logits on (sequence i with seed + i
  // when the request has a seed). One stream per sequence, in order; each can be cancelled by
  // its id. Errors as submit(); INVALID_ARGUMENT for n < 1 or forced completions with n > 1.
  StatusOr<std::vector<std::shared_ptr<RequestStream>>> submit_parallel(GenerateRequest request,
                                                                        int32_t n);
  // Cancels a request: its stream ends with kAbort and its KV is freed at the next step boundary.
  // Unknown or finished ids are ignored. Thread-safe.
  void cancel(RequestId id);
  // Drops a session's stored KV; false if the store holds none for it (or there is no store).
  // A turn of the session still running keeps saving, findable by content only. Thread-safe.
  bool end_session(const std::string& session);
  // The prompt tokens of `prompt` whose KV this engine's store holds now, and the farthest tier
  // they would be loaded from ("" when none, or without a store), as `tenant` and `session`
  // would find them; nothing is counted or loaded. Routers use it to pick a replica.
  // Thread-safe.
  std::pair<int64_t, std::string> stored_prefix(std::span<const TokenId> prompt,
                                                const std::string& tenant,
                                                const std::string& session) const;

  const model::ModelConfig& model_config() const;
  // The served weights' identity (model::ModelSource::content_fingerprint): the prefix hashes'
  // root, and what a `strata profile` file records.
  uint64_t model_fingerprint() const { return model_fingerprint_; }
  // The one overflow policy of every front door: true when a prompt that fills the context
  // window runs with its oldest history dropped (overflow_truncation_fraction > 0), false when
  // submit() rejects it.
  bool truncates_overflow() const { return options_.scheduler.overflow_truncation_fraction > 0; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const executor::Executor& executor() const { return *executor_; }
  EngineStats stats() const;

 private:
  struct Active;
  Engine() = default;
  // Builds the executor, KV manager and scheduler; runs on the step thread.
  Status start_on_step_thread();
  void loop();
  void step();
  // A submitted request: its first sequence's stream, and the streams its forks will feed.
  struct Submission {
    GenerateRequest request;
    std::shared_ptr<RequestStream> stream;
    std::vector<std::shared_ptr<RequestStream>> forks;
    std::chrono::steady_clock::time_point submitted;  // TTFT counts from here
    int32_t task = 0;  // request.kv_task resolved (restore::SequenceInfo::task)
  };
  void admit(std::vector<Submission> submissions);
  // UNAVAILABLE while stopping, RESOURCE_EXHAUSTED when the queue is full (REQUIRES mutex_).
  Status queue_room() const;
  // Starts `parent`'s pending forks from its prefill's last-position logits `last`.
  void start_forks(Active& parent, std::span<const float> last);
  // Sends the final delta, frees the sequence and forgets the request.
  void finish(Active& active, RequestOutput output, FinishReason reason, std::string error = {});
  void emit_token(Active& active, const sampling::SampleResult& sample);
  void refresh_stats();
  // Tokens to drop after the first block of `prompt` (a multiple of the block size): what the
  // context window needs, and at least what `match` (an item made from truncated history) dropped.
  int64_t tokens_to_drop(std::span<const TokenId> prompt,
                         const std::optional<store::StoreMatch>& match) const;
  // Records the prompt logprobs of rows [0, num_rows) of `logits` (chunk positions from
  // `start_position`) for a request that asked for them.
  void record_prompt_logprobs(Active& active, int64_t start_position, const float* logits,
                              int64_t num_rows, int64_t vocab);
  // Builds the pass's sequence chunks from the scheduled ones, counting prefix-cache hits.
  void build_chunks(const scheduler::ScheduledBatch& batch, executor::ForwardBatch& forward);

  std::unique_ptr<model::ModelSource> source_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<executor::Executor> executor_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  kv::KvLayout layout_;  // every sequence's: kv_cache.page_format on every layer, or the default
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  // Declared after the executor: destroyed first, while its pending saves can still complete.
  // Null without a KV store.
  std::unique_ptr<restore::RestoreCoordinator> restore_;
  EngineOptions options_;
  uint64_t model_fingerprint_ = 0;

  // Shared with client threads, guarded by mutex_.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Submission> inbox_;
  std::vector<RequestId> cancels_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  EngineStats stats_;

  // Step-loop state (loop thread only).
  std::unordered_map<SeqId, std::unique_ptr<Active>> active_;
  std::thread thread_;
};

}  // namespace strata::engine
