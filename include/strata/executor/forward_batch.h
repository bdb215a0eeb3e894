// The unit of work the executor runs: new tokens for several sequences at once, each appended to
// that sequence's KV cache, and which logits to return.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/common/ids.h"

namespace strata::executor {

enum class LogitsMode {
  kLast,  // one row: the distribution after the chunk's last token
  kAll,   // one row per token of the chunk (perplexity, reference checks)
  kNone,  // no rows (a prefill chunk that is not the prompt's last)
};

struct SequenceChunk {
  SeqId seq;
  // Tokens at positions [cached, cached + tokens.size()) of the sequence, where `cached` is what
  // the executor already holds for it (0 for a new sequence).
  std::vector<TokenId> tokens;
  LogitsMode logits = LogitsMode::kLast;
};

struct ForwardBatch {
  std::vector<SequenceChunk> chunks;  // at most one chunk per sequence
};

struct ForwardResult {
  int64_t vocab_size = 0;
  // Rows in chunk order (LogitsMode decides how many each chunk has): [num_rows, vocab_size],
  // float32, row-major, on the host.
  std::vector<float> logits;
  // First row of each chunk; row_offsets[i + 1] - row_offsets[i] rows belong to chunk i.
  std::vector<int64_t> row_offsets;
};

}  // namespace strata::executor
