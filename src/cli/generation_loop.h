// Prompt-in, tokens-out loop over the executor for the offline CLI commands (generate, chat).
// One sequence at a time; the engine (scheduler + batching) supersedes this for serving.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/executor/executor.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {

struct SamplingOptions {
  double temperature = 0.0;  // 0 = greedy (argmax, lowest id on ties)
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 = off
  uint64_t seed = 0;
};

enum class FinishReason { kStop, kLength };
const char* finish_reason_name(FinishReason reason);

struct GenerationResult {
  std::vector<TokenId> generated;  // includes the stop token if one ended generation
  FinishReason finish_reason = FinishReason::kLength;
  double prefill_ms = 0;
  double decode_ms = 0;  // from the first generated token to the last
};

class GenerationLoop {
 public:
  GenerationLoop(executor::Executor& executor, const tokenizer::Tokenizer& tokenizer,
                 SamplingOptions sampling);

  // Runs `prompt` (continuing the loop's sequence when the tokens already processed are a prefix
  // of it, otherwise starting over) and samples up to max_tokens tokens. `on_text` receives
  // streamed text as soon as it forms complete UTF-8; stop tokens are not shown.
  // REQUIRES prompt non-empty. Errors come from the executor (e.g. context overflow).
  StatusOr<GenerationResult> run(const std::vector<TokenId>& prompt, int64_t max_tokens,
                                 bool ignore_stop_tokens,
                                 const std::function<void(const std::string&)>& on_text);

 private:
  TokenId sample(const float* logits);

  executor::Executor& executor_;
  const tokenizer::Tokenizer& tokenizer_;
  SamplingOptions sampling_;
  std::mt19937_64 rng_;
  SeqId seq_{1};
  std::vector<TokenId> processed_;  // tokens whose KV the executor holds for seq_
};

}  // namespace strata::cli
