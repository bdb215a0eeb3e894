#include "generation_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace strata::cli {
namespace {

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
      .count();
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

GenerationLoop::GenerationLoop(executor::Executor& executor, const tokenizer::Tokenizer& tokenizer,
                               SamplingOptions sampling)
    : executor_(executor), tokenizer_(tokenizer), sampling_(sampling), rng_(sampling.seed) {}

TokenId GenerationLoop::sample(const float* logits) {
  const int64_t vocab = executor_.config().vocab_size;
  if (sampling_.temperature <= 0) {
    return static_cast<TokenId>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<TokenId> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  int64_t keep = sampling_.top_k > 0 ? std::min(sampling_.top_k, vocab) : vocab;
  std::vector<double> probs(keep);
  const double max_logit = logits[order[0]];
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) / sampling_.temperature);
    total += probs[i];
  }
  double cumulative = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cumulative += probs[i] / total;
    if (cumulative >= sampling_.top_p) {
      keep = i + 1;
      break;
    }
  }
  std::discrete_distribution<int64_t> dist(probs.begin(), probs.begin() + keep);
  return order[dist(rng_)];
}

StatusOr<GenerationResult> GenerationLoop::run(
    const std::vector<TokenId>& prompt, int64_t max_tokens, bool ignore_stop_tokens,
    const std::function<void(const std::string&)>& on_text) {
  GenerationResult result;
  // Reuse the cached KV when the new prompt extends what was processed (multi-turn chat).
  const bool extends = processed_.size() < prompt.size() &&
                       std::equal(processed_.begin(), processed_.end(), prompt.begin());
  if (!extends) {
    executor_.release(seq_);
    processed_.clear();
  }
  const std::vector<TokenId> stop_ids = tokenizer_.stop_ids();
  tokenizer::StreamDecoder decoder(tokenizer_);

  executor::ForwardBatch batch;
  batch.chunks.push_back({seq_, std::vector<TokenId>(prompt.begin() + processed_.size(),
                                                     prompt.end())});
  const auto prefill_start = std::chrono::steady_clock::now();
  auto decode_start = prefill_start;
  for (int64_t step = 0; step < max_tokens; ++step) {
    StatusOr<executor::ForwardResult> forward = executor_.forward(batch);
    if (!forward.ok()) {
      // The executor left the sequence unchanged; forget it so the next run starts clean.
      executor_.release(seq_);
      processed_.clear();
      return forward.status();
    }
    processed_.insert(processed_.end(), batch.chunks[0].tokens.begin(),
                      batch.chunks[0].tokens.end());
    if (step == 0) {
      result.prefill_ms = elapsed_ms(prefill_start);
      decode_start = std::chrono::steady_clock::now();
    }
    const TokenId next = sample(forward->logits.data());
    result.generated.push_back(next);
    const bool is_stop = std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end();
    if (is_stop && !ignore_stop_tokens) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (on_text) on_text(decoder.push(next));
    if (static_cast<int64_t>(processed_.size()) + 1 > executor_.config().max_context_tokens) {
      break;  // the context window is full: finish with kLength
    }
    batch.chunks[0].tokens = {next};
  }
  if (on_text) on_text(decoder.flush());
  result.decode_ms = elapsed_ms(decode_start);
  return result;
}

}  // namespace strata::cli
