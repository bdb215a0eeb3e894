// A request in flight as the engine's step loop holds it (private to the engine), and the
// scoring of one token that both the step and the prompt logprobs use.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "strata/engine/engine.h"
#include "strata/sampling/stop_checker.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::engine {

// A request in flight (step-loop thread only).
struct Engine::Active {
  RequestId id;
  std::shared_ptr<RequestStream> stream;
  sampling::SequenceSampler sampler;
  sampling::StopChecker stop_checker;
  tokenizer::StreamDecoder decoder;
  std::vector<TokenId> stop_ids;  // tokens that end generation
  std::chrono::steady_clock::time_point submitted;
  Usage usage;
  bool prefix_hit_recorded = false;
  // With SamplingParams::prompt_logprobs: entry i scores prompt token i + 1; sent with the first
  // token.
  std::vector<TokenOutput> prompt_logprobs;
  bool scores_prompt() const { return sampler.params().prompt_logprobs.has_value(); }
  std::vector<TokenId> forced;  // GenerateRequest::forced_completion
  bool compress_kv = true;      // GenerateRequest::compress_kv
  // submit_parallel: the streams of the sequences that fork from this one once its prompt is
  // computed (then cleared).
  std::vector<std::shared_ptr<RequestStream>> forks;
};

// The raw logprob of `target` under one row of logits, with the `num_top` most likely tokens
// (descending, lowest id first among equals).
TokenOutput score_token(std::span<const float> logits, TokenId target, int32_t num_top);

}  // namespace strata::engine
