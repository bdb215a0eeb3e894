// What a request's sequences send to their streams (engine.h): the stream itself, sampled
// tokens with their stop handling, prompt logprobs, the forks of parallel samples, and the final
// delta.

#include <algorithm>
#include <cmath>

#include "active_request.h"
#include "strata/common/check.h"
#include "strata/kv/kv_cache_manager.h"

namespace strata::engine {

using Clock = std::chrono::steady_clock;

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

void Engine::start_forks(Active& parent, std::span<const float> last) {
  const SeqId parent_seq{parent.id.value};
  std::vector<std::shared_ptr<RequestStream>> forks = std::move(parent.forks);
  parent.forks.clear();
  const std::vector<TokenId> prompt = kv_->tokens(parent_seq);
  for (size_t i = 0; i < forks.size(); ++i) {
    const SeqId seq{forks[i]->id().value};
    sampling::SamplingParams params = parent.sampler.params();
    params.prompt_logprobs.reset();  // the first sequence reports them
    if (params.seed) *params.seed += i + 1;
    auto active = std::make_unique<Active>(
        forks[i]->id(), forks[i],
        sampling::SequenceSampler(params, static_cast<int64_t>(last.size()), prompt),
        sampling::StopChecker(params), tokenizer::StreamDecoder(*tokenizer_), parent.stop_ids,
        parent.submitted);
    active->usage = parent.usage;
    active->compress_kv = parent.compress_kv;
    Active& ref = *active;
    active_.emplace(seq, std::move(active));
    if (Status forked = scheduler_->fork(parent_seq, seq); !forked.ok()) {
      finish(ref, {}, FinishReason::kError, "n: " + forked.message());
      continue;
    }
    if (restore_) restore_->forked(parent_seq, seq);
    emit_token(ref, ref.sampler.sample(last));
  }
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

void Engine::finish(Active& active, RequestOutput output, FinishReason reason, std::string error) {
  // Forks that never started end with their parent (its prompt failed or was cancelled).
  for (const std::shared_ptr<RequestStream>& fork : active.forks) {
    RequestOutput ended;
    ended.finish_reason = reason == FinishReason::kError ? reason : FinishReason::kAbort;
    ended.error = error;
    fork->push(std::move(ended));
  }
  active.forks.clear();
  output.finish_reason = reason;
  output.error = std::move(error);
  output.usage = active.usage;
  const SeqId seq{active.id.value};
  if (restore_) restore_->finish(seq, reason == FinishReason::kStop || reason == FinishReason::kLength);
  active.stream->push(std::move(output));
  executor_->end_sequence(seq);
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

}  // namespace strata::engine
