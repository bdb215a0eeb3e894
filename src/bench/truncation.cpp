#include "strata/bench/truncation.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kv_experiment.h"
#include "strata/executor/executor.h"

namespace strata::bench {

StatusOr<TruncationResult> measure_truncation(executor::Executor& executor,
                                              std::span<const TokenId> text,
                                              const TruncationOptions& options) {
  Experiment x(executor);
  const int64_t b = x.block();
  const int64_t history = options.history_tokens, drop = options.drop_tokens;
  const int64_t eval = options.eval_tokens;
  const int64_t head = options.keep_first_block ? b : 0;  // tokens kept before the dropped ones
  if (history % b != 0 || drop % b != 0 || drop <= 0 || head + drop >= history) {
    return invalid_argument_error(
        "truncation: history (" + std::to_string(history) + ") and drop (" + std::to_string(drop) +
        ") must be multiples of the block size " + std::to_string(b) + " that keep some history");
  }
  if (eval < 2 || options.eval_chunk_tokens < 1 ||
      static_cast<int64_t>(text.size()) < history + eval) {
    return invalid_argument_error("truncation: the text has " + std::to_string(text.size()) +
                                  " tokens, " + std::to_string(history + eval) + " needed");
  }
  const int64_t stored = history / b;
  // The history's blocks that stay, in order: block 0 (with keep_first_block), then the newest.
  std::vector<int64_t> kept_blocks;
  if (head > 0) kept_blocks.push_back(0);
  for (int64_t j = (head + drop) / b; j < stored; ++j) kept_blocks.push_back(j);
  const auto kept = static_cast<int64_t>(kept_blocks.size());
  std::vector<TokenId> truncated(text.begin(), text.begin() + head);
  truncated.insert(truncated.end(), text.begin() + head + drop, text.begin() + history + eval);
  const std::span<const TokenId> continuation = text.subspan(history, eval);

  // The previous turn computes the history and saves every block (keys before RoPE).
  const SeqId previous{1}, scratch{2};
  STRATA_RETURN_IF_ERROR(x.kv().add_sequence(
      previous, std::vector<TokenId>(text.begin(), text.begin() + history), ""));
  Chunks saved = x.chunks(stored);
  STRATA_RETURN_IF_ERROR(
      x.run(previous, history, executor::LogitsMode::kNone, {}, &saved).status());
  Chunks ca;
  for (int64_t j : kept_blocks) ca.push_back(saved[j]);

  // NKVT: the kept blocks saved as if they sat at their new positions, so that loading leaves
  // their keys rotated for the old ones. A hand-made pass whose page tables put kept block j at
  // index j saves them; its one token writes into a scratch block.
  STRATA_RETURN_IF_ERROR(
      x.kv().add_sequence(scratch, std::vector<TokenId>(text.begin(), text.begin() + b), ""));
  STRATA_RETURN_IF_ERROR(x.run(scratch, b, executor::LogitsMode::kNone).status());
  std::vector<std::vector<kv::BlockId>> shifted = x.kv().tables(previous);
  for (size_t l = 0; l < shifted.size(); ++l) {
    std::vector<kv::BlockId> table;
    for (int64_t j : kept_blocks) table.push_back(shifted[l][j]);
    table.push_back(x.kv().tables(scratch)[l][0]);
    shifted[l] = std::move(table);
  }
  Chunks nkvt = x.chunks(kept);
  executor::ForwardBatch shifted_pass;
  shifted_pass.chunks.push_back(
      {scratch, {text[0]}, kept * b, shifted, executor::LogitsMode::kNone});
  shifted_pass.saves.push_back(Experiment::save_of(scratch, 0, nkvt));
  STRATA_ASSIGN_OR_RETURN(executor::ForwardResult shifted_result, executor.forward(shifted_pass));
  if (shifted_result.saves_written) shifted_result.saves_written();
  x.kv().free(previous);
  x.kv().free(scratch);

  // Scores the continuation after the kept history, recomputed (no chunks) or loaded.
  auto score = [&](SeqId seq, const Chunks* source) -> StatusOr<TruncationScore> {
    STRATA_RETURN_IF_ERROR(x.kv().add_sequence(seq, truncated, ""));
    std::vector<executor::KvLoad> loads;
    if (source != nullptr) {
      x.kv().set_external_prefix(seq, kept, /*exact=*/false);
      executor::KvLoad load{seq, 0, {}, std::nullopt};
      for (const auto& c : *source) load.chunks.push_back(c.data());
      loads.push_back(std::move(load));
    } else {
      STRATA_RETURN_IF_ERROR(x.run(seq, kept * b, executor::LogitsMode::kNone).status());
    }
    TruncationScore scores;
    STRATA_ASSIGN_OR_RETURN(scores.nll, x.score_continuation(seq, continuation,
                                                             options.eval_chunk_tokens,
                                                             std::move(loads)));
    x.kv().free(seq);
    scores.perplexity = std::exp(scores.nll / static_cast<double>(eval - 1));
    return scores;
  };
  TruncationResult result;
  result.scored_tokens = eval - 1;
  STRATA_ASSIGN_OR_RETURN(result.tt, score(SeqId{3}, nullptr));
  STRATA_ASSIGN_OR_RETURN(result.ca, score(SeqId{4}, &ca));
  STRATA_ASSIGN_OR_RETURN(result.nkvt, score(SeqId{5}, &nkvt));
  return result;
}

}  // namespace strata::bench
