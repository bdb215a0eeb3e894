// What a client asks of one sequence's decoding: how to pick each token (temperature, truncation,
// penalties, seed), what to report (logprobs) and when to stop (length, stop tokens, stop strings).
// Field meanings follow the OpenAI / vLLM request fields of the same names.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"

namespace strata::sampling {

class Grammar;

// Limits enforced by SamplingParams::validate().
inline constexpr int32_t kMaxNumLogprobs = 20;
inline constexpr size_t kMaxNumStopStrings = 16;
inline constexpr double kMaxAbsPresencePenalty = 2.0;   // OpenAI / vLLM range [-2, 2]
inline constexpr double kMaxAbsFrequencyPenalty = 2.0;  // OpenAI / vLLM range [-2, 2]
// Temperatures below this sample greedily (as vLLM does): dividing by a tinier one overflows.
inline constexpr double kGreedyTemperature = 1e-5;

// Plain value type; copyable; thread-compatible. Every field has an "off" default except
// temperature (1.0, as OpenAI and vLLM) and max_tokens (16, as vLLM).
struct SamplingParams {
  // Logits are divided by it before the softmax. 0 = greedy: argmax of the penalised logits,
  // lowest id on ties. Values below kGreedyTemperature are treated as 0. Finite, >= 0.
  double temperature = 1.0;
  // Keep only the top_k most likely tokens. 0 = off; values >= vocab size keep everything.
  int32_t top_k = 0;
  // Nucleus: keep the smallest set of most likely tokens whose probability mass is >= top_p.
  // 1 = off. In (0, 1].
  double top_p = 1.0;
  // Keep tokens whose probability is >= min_p * (probability of the most likely token). 0 = off.
  double min_p = 0.0;
  // HF / vLLM semantics: the logit of every token seen in the prompt or the output so far is
  // divided by it when positive and multiplied by it when negative. 1 = off. > 0.
  double repetition_penalty = 1.0;
  // OpenAI semantics, over generated tokens only (not the prompt):
  //   logit -= frequency_penalty * count(token) + presence_penalty * (count(token) > 0).
  // 0 = off. Each in [-2, 2].
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  // The same seed, prompt and logits give the same tokens (see SequenceSampler). Without a seed,
  // each SequenceSampler draws a random one.
  std::optional<uint64_t> seed;
  // Number of tokens to generate at most (the stop token, if any, counts). >= 1.
  int64_t max_tokens = 16;
  // Generation ends when one of these is sampled; applies even with ignore_eos. Each in
  // [0, vocab_size). The token is part of the output ids; its text is not shown.
  std::vector<TokenId> stop_token_ids;
  // Generation ends when the output text contains one of these (see StopChecker). At most
  // kMaxNumStopStrings, each non-empty.
  std::vector<std::string> stop;
  // Keep generating past the model's end-of-sequence tokens (stop_token_ids still apply).
  bool ignore_eos = false;
  // Number of top alternatives whose logprobs are returned with each sampled token, in
  // [0, kMaxNumLogprobs]. The sampled token's own logprob is always returned.
  int32_t num_logprobs = 0;
  // Also score the prompt: the raw model logprob (log-softmax of the logits, no temperature or
  // penalties) of every prompt token after the first given the tokens before it, with this many
  // top alternatives each, in [0, kMaxNumLogprobs] (vLLM's prompt_logprobs; OpenAI's echo). Unset
  // = off. The prompt is then computed in full: it neither reads cached KV nor is truncated.
  std::optional<int32_t> prompt_logprobs;
  // Whether the matched stop string is part of the output text.
  bool include_stop_str_in_output = false;
  // Structured outputs: only tokens the grammar allows next can be drawn (grammar.h); null = off.
  std::shared_ptr<const Grammar> grammar;

  // OK, or INVALID_ARGUMENT whose message names the first offending field and its value, e.g.
  // "temperature must be >= 0, got -1". `vocab_size` is the number of logits per row (the model's
  // vocabulary size); a non-positive one is INVALID_ARGUMENT too. NaN and infinities are rejected.
  Status validate(int64_t vocab_size) const;
};

// The values a request's unset sampling fields take, where the model or the deployment sets them
// (vLLM applies the model's generation config the same way). Unset fields keep SamplingParams'
// own defaults.
struct SamplingDefaults {
  std::optional<double> temperature;
  std::optional<int32_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<double> presence_penalty;
  std::optional<double> frequency_penalty;

  // Ours, with every field `over` sets replaced by its value.
  SamplingDefaults overlaid_with(const SamplingDefaults& over) const;
  // SamplingParams with these defaults in place of its own.
  SamplingParams params() const;
  // "temperature=0.7 top_p=0.9", or "none".
  std::string describe() const;
  // The set fields checked as SamplingParams::validate checks them.
  Status validate() const;
  bool operator==(const SamplingDefaults&) const = default;
};

}  // namespace strata::sampling
