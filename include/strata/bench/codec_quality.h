// AdaptCache's quality profile (paper §2, "offline profiling"; docs/adaptcache.md): how much each
// of the store's lossy item codecs changes what the model answers after its entry is restored,
// measured on the executor one entry at a time (no batching, so the numbers repeat exactly).
//
// An entry is a history (a stored conversation or document: whole token blocks) and the next
// prompt's new tokens. The history is computed and saved as store chunks (keys before RoPE). Each
// codec then restores it as the store serves it: "none" loads the raw chunks; KIVI chunks are
// encoded by the store's transcoder (Executor::transcode_kv_chunks) and decoded by the load;
// token dropping loads only the chunks store::kept_chunks keeps (chunk 0, the sinks, and the most
// recent ones) at contiguous positions; the layer merge merges and restores the chunks as the
// store does (Executor::merge_kv_chunks / unmerge_kv_chunks) with MiniCache's pairs at the
// default layer_share (Krul's pairs need a served turn's attention). After each restore:
//   answer      the greedy answer to the prompt (at most answer_tokens, ending at eos): "none"'s
//               is the reference answer (the uncompressed model's answer, as the paper scores);
//   agreement   teacher forcing the reference answer: the share of its positions whose argmax is
//               "none"'s argmax there (a logit-level measure: one changed token does not change
//               the rest of the answer as it does for the generated answers);
//   kl          the mean KL(none || codec) of the next-token distributions at those positions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"

namespace strata::executor {
class Executor;
}

namespace strata::bench {

struct CodecQualityOptions {
  int64_t answer_tokens = 64;  // the longest answer generated
  std::optional<TokenId> eos;  // ends an answer (the token is part of it)
};

struct CodecQuality {
  std::string codec;           // "none", then store::kItemCodecs' names in their order
  double stored_share = 1;     // the restored history's stored bytes / the raw history's
  int64_t dropped_tokens = 0;  // history tokens token dropping left out
  std::vector<TokenId> answer;
  double agreement = 1;
  double kl = 0;  // nats
};

struct CodecQualityResult {
  int64_t history_tokens = 0;
  int64_t prompt_tokens = 0;
  std::vector<CodecQuality> codecs;  // codecs[0] is "none": answer is the reference
};

// Runs every codec on one entry. history: a multiple of the block size, at least 2 blocks;
// prompt: at least 1 token. The executor's pool must hold a sequence of history + prompt +
// answer_tokens tokens besides what it holds. INVALID_ARGUMENT for lengths that do not fit.
StatusOr<CodecQualityResult> measure_codec_quality(executor::Executor& executor,
                                                   std::span<const TokenId> history,
                                                   std::span<const TokenId> prompt,
                                                   const CodecQualityOptions& options);

}  // namespace strata::bench
