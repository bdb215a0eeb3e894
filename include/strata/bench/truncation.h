// CachedAttention's truncation experiment (ATC'24 §3.4, Table 1), on the executor: does KV that
// was saved before RoPE, truncated and re-rotated to compacted positions still model the text?
//
// A history of `history_tokens` is computed and saved as store chunks (keys before RoPE, the
// KvSave path). The context then overflows: `drop_tokens` of the history are dropped (after the
// first block, or from the very start without keep_first_block) and the next `eval_tokens` of the
// text are scored three ways:
//   TT   recompute the truncated text (kept tokens at positions 0..), then score: the reference;
//   CA   load the kept chunks re-rotated to compacted positions (CachedAttention), then score;
//   NKVT load the kept KV without re-rotation (keys keep their old positions): the paper's
//        negative control, which shows the comparison can fail.
// The paper reports |CA - TT| <= 0.02 perplexity on LLaMA-7B/13B (PPL ~5-8) and NKVT > 10^3.
#pragma once

#include <cstdint>
#include <span>

#include "strata/common/ids.h"
#include "strata/common/status.h"

namespace strata::executor {
class Executor;
}

namespace strata::bench {

struct TruncationOptions {
  int64_t history_tokens = 1024;  // multiple of the block size
  int64_t drop_tokens = 512;      // multiple of the block size, < history_tokens
  int64_t eval_tokens = 1536;     // scored continuation (its first token is not scored)
  // Keep block 0 (the attention sink) and drop the blocks after it (Strata's engine), or drop
  // the oldest tokens including the first (the paper's "earliest half").
  bool keep_first_block = true;
  int64_t eval_chunk_tokens = 512;  // continuation tokens per forward pass (bounds logits memory)
};

struct TruncationScore {
  double nll = 0;         // summed over the scored tokens
  double perplexity = 0;  // exp(nll / scored tokens)
};

struct TruncationResult {
  int64_t scored_tokens = 0;
  TruncationScore tt, ca, nkvt;
};

// Runs the experiment on text[0, history_tokens + eval_tokens) with a private KV manager over the
// executor's pool (which must hold two sequences of history + eval tokens besides what it holds).
// INVALID_ARGUMENT for options that do not fit the text or the block size.
StatusOr<TruncationResult> measure_truncation(executor::Executor& executor,
                                              std::span<const TokenId> text,
                                              const TruncationOptions& options);

}  // namespace strata::bench
