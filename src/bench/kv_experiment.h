// Experiments on the executor with a private KV manager (the bench library's quality
// experiments: truncation.cpp, krul_quality.cpp): passes of one sequence at a time that save
// their blocks as store chunks or load chunks instead of computing them, and the NLL of a token.
// Private to src/bench.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"

namespace strata::bench {

using Chunks = std::vector<std::vector<std::byte>>;

// -log p(target) of one row of logits, in double.
inline double token_nll(const float* row, int64_t vocab, TokenId target) {
  const float max = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v] - max));
  return std::log(sum) + max - row[target];
}

class Experiment {
 public:
  explicit Experiment(executor::Executor& executor)
      : executor_(executor),
        kv_(executor.kv_geometry(), executor.kv_format(), kv::PrefixCacheOptions{false, 0}),
        block_(executor.kv_geometry().block_size_tokens) {}

  int64_t block() const { return block_; }

  Chunks chunks(int64_t n) const {
    return Chunks(n, std::vector<std::byte>(executor_.kv_chunk_bytes()));
  }

  // Runs tokens [computed, computed + n) of `seq` with `loads`, saving token blocks
  // [0, saved->size()) when `saved` is given, adding its attention rows (those at multiples of
  // observe_row_stride) to the executor's Krul statistics with observe_attention; returns the
  // logits of `mode`.
  StatusOr<std::vector<float>> run(SeqId seq, int64_t n, executor::LogitsMode mode,
                                   std::vector<executor::KvLoad> loads = {},
                                   Chunks* saved = nullptr, bool observe_attention = false,
                                   int32_t observe_row_stride = 1) {
    STRATA_ASSIGN_OR_RETURN(kv::KvPlan plan, kv_.prepare({{seq, n}}));
    executor::ForwardBatch batch;
    kv_.commit(std::move(plan), &batch.copies);
    const int64_t start = kv_.num_computed_tokens(seq);
    const std::vector<TokenId>& t = kv_.tokens(seq);
    batch.chunks.push_back({seq, std::vector<TokenId>(t.begin() + start, t.begin() + start + n),
                            start, kv_.tables(seq), mode});
    batch.chunks.back().observe_attention = observe_attention;
    batch.chunks.back().observe_row_stride = observe_row_stride;
    batch.loads = std::move(loads);
    if (saved != nullptr) batch.saves.push_back(save_of(seq, 0, *saved));
    STRATA_ASSIGN_OR_RETURN(executor::ForwardResult result, executor_.forward(batch));
    if (result.saves_written) result.saves_written();
    kv_.mark_computed(seq, n);
    return std::move(result.logits);
  }

  // Summed -log p of continuation[1..] (its first token is not scored), the continuation's
  // tokens being the next ones of `seq` (computed from its current end on): passes of at most
  // chunk_tokens, the first with `loads`. Row r of a pass starting at continuation token i
  // predicts continuation token i + r + 1.
  StatusOr<double> score_continuation(SeqId seq, std::span<const TokenId> continuation,
                                      int64_t chunk_tokens, std::vector<executor::KvLoad> loads) {
    const int64_t vocab = executor_.config().vocab_size;
    const int64_t eval = static_cast<int64_t>(continuation.size());
    double nll = 0;
    for (int64_t i = 0; i < eval - 1;) {
      const int64_t n = std::min(chunk_tokens, eval - 1 - i);
      STRATA_ASSIGN_OR_RETURN(std::vector<float> logits,
                              run(seq, n, executor::LogitsMode::kAll, std::move(loads)));
      loads.clear();
      for (int64_t r = 0; r < n; ++r) {
        nll += token_nll(logits.data() + r * vocab, vocab,
                         continuation[static_cast<size_t>(i + r + 1)]);
      }
      i += n;
    }
    return nll;
  }

  static executor::KvSave save_of(SeqId seq, int64_t first_block, Chunks& destinations) {
    executor::KvSave save{seq, first_block, {}};
    for (auto& c : destinations) save.chunks.push_back(c.data());
    return save;
  }

  kv::KvCacheManager& kv() { return kv_; }
  executor::Executor& executor() { return executor_; }

 private:
  executor::Executor& executor_;
  kv::KvCacheManager kv_;
  int64_t block_;
};

}  // namespace strata::bench
