// Reusing stored KV on the default model (fp32, CPU): the executor's save_chunks / KvLoad path
// that the KV store rides on.
//   * A turn resumed from saved chunks (keys un-rotated on save, rotated again on load) gives the
//     logits and greedy tokens of recomputing its whole history.
//   * Decoupled truncation (CachedAttention §3.4): dropping the oldest half of a stored history
//     (after its first block) and loading the rest at compacted positions gives nearly the
//     perplexity of recomputing the truncated text (TT), on WikiText-2. Loading it without
//     re-rotation (NKVT) is far worse, which shows the check can fail.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::executor {
namespace {

class KvReuseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    source_ = model::open_model_source(STRATA_TEST_MODEL).value().release();
    tokenizer_ = tokenizer::Tokenizer::from_gguf(*source_->gguf()).value().release();
    ExecutorOptions options;
    options.kv_cache_bytes = int64_t{400} << 20;
    executor_ = Executor::create(*source_, options).value().release();
  }
  static void TearDownTestSuite() {
    delete executor_;
    delete tokenizer_;
    delete source_;
  }

  void SetUp() override {
    kv_ = std::make_unique<kv::KvCacheManager>(executor_->kv_geometry(), executor_->kv_format(),
                                               kv::PrefixCacheOptions{false, 0});
  }

  int64_t block() const { return executor_->kv_geometry().block_size_tokens; }

  // Runs tokens [computed, computed + n) of `seq` (plus `loads`); returns all or last logits.
  std::vector<float> run(SeqId seq, int64_t n, LogitsMode mode, std::vector<KvLoad> loads = {}) {
    StatusOr<kv::KvPlan> plan = kv_->prepare({{seq, n}});
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    ForwardBatch batch;
    kv_->commit(std::move(plan).value(), &batch.copies);
    const int64_t start = kv_->num_computed_tokens(seq);
    const std::vector<TokenId>& t = kv_->tokens(seq);
    batch.chunks.push_back({seq, std::vector<TokenId>(t.begin() + start, t.begin() + start + n),
                            start, kv_->tables(seq), mode});
    batch.loads = std::move(loads);
    StatusOr<ForwardResult> result = executor_->forward(batch);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    kv_->mark_computed(seq, n);
    return result.ok() ? result->logits : std::vector<float>{};
  }

  // Saves blocks [0, n) of `seq` as store chunks (tables optionally shifted by `skip` blocks,
  // which reads blocks skip.. as if they were 0..: the NKVT emulation below).
  std::vector<std::vector<std::byte>> save(SeqId seq, int64_t n, int64_t skip = 0) {
    std::vector<std::vector<kv::BlockId>> tables = kv_->tables(seq);
    for (auto& t : tables) t.erase(t.begin(), t.begin() + skip);
    std::vector<std::vector<std::byte>> chunks(n, std::vector<std::byte>(executor_->kv_chunk_bytes()));
    std::vector<std::byte*> destinations;
    for (auto& c : chunks) destinations.push_back(c.data());
    StatusOr<std::function<void()>> wait = executor_->save_chunks(tables, 0, destinations);
    EXPECT_TRUE(wait.ok()) << wait.status().to_string();
    if (wait.ok() && *wait) (*wait)();
    return chunks;
  }

  static KvLoad load_of(SeqId seq, const std::vector<std::vector<std::byte>>& chunks,
                        size_t first, size_t count) {
    KvLoad load{seq, 0, {}};
    for (size_t i = first; i < first + count; ++i) load.chunks.push_back(chunks[i].data());
    return load;
  }

  int64_t argmax(const std::vector<float>& row) const {
    return std::max_element(row.begin(), row.end()) - row.begin();
  }

  // Perplexity of tokens t[1:] given the rows of logits over t[:-1] (kAll over t).
  double perplexity(const std::vector<float>& logits, const std::vector<TokenId>& t) const {
    const int64_t vocab = source_->config().vocab_size;
    double nll = 0;
    for (size_t i = 0; i + 1 < t.size(); ++i) {
      const float* row = logits.data() + i * vocab;
      const float max = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v] - max));
      nll += std::log(sum) + max - row[t[i + 1]];
    }
    return std::exp(nll / static_cast<double>(t.size() - 1));
  }

  std::vector<TokenId> wikitext(size_t skip_chars, size_t n_tokens) const {
    std::ifstream in(STRATA_SOURCE_DIR "/../shared/data/ppl/wikitext-2-raw-v1_test.raw");
    std::stringstream text;
    text << in.rdbuf();
    std::vector<TokenId> t = tokenizer_->encode(text.str().substr(skip_chars, n_tokens * 8), false);
    EXPECT_GE(t.size(), n_tokens) << "WikiText-2 not found or too short";
    t.resize(std::min(t.size(), n_tokens));
    return t;
  }

  static inline model::ModelSource* source_ = nullptr;
  static inline tokenizer::Tokenizer* tokenizer_ = nullptr;
  static inline Executor* executor_ = nullptr;
  std::unique_ptr<kv::KvCacheManager> kv_;
};

TEST_F(KvReuseTest, AResumedTurnMatchesRecomputingItsHistory) {
  const std::vector<TokenId> history = wikitext(10000, 200);  // 12 full blocks + 8 tokens
  const std::vector<TokenId> turn = wikitext(50000, 37);
  std::vector<TokenId> prompt = history;
  prompt.insert(prompt.end(), turn.begin(), turn.end());
  const int64_t stored = static_cast<int64_t>(history.size()) / block();

  // The previous turn: compute the history, save its full blocks, drop the sequence.
  ASSERT_TRUE(kv_->add_sequence(SeqId{1}, history, "").ok());
  run(SeqId{1}, static_cast<int64_t>(history.size()), LogitsMode::kNone);
  const std::vector<std::vector<std::byte>> chunks = save(SeqId{1}, stored);
  kv_->free(SeqId{1});

  // Recompute everything vs. load the stored blocks and compute the rest; then decode greedily.
  ASSERT_TRUE(kv_->add_sequence(SeqId{2}, prompt, "").ok());
  ASSERT_TRUE(kv_->add_sequence(SeqId{3}, prompt, "").ok());
  kv_->set_external_prefix(SeqId{3}, stored, /*exact=*/true);
  const int64_t rest = static_cast<int64_t>(prompt.size()) - stored * block();
  std::vector<float> full = run(SeqId{2}, static_cast<int64_t>(prompt.size()), LogitsMode::kLast);
  std::vector<float> resumed = run(SeqId{3}, rest, LogitsMode::kLast,
                                   {load_of(SeqId{3}, chunks, 0, static_cast<size_t>(stored))});
  EXPECT_EQ(kv_->num_loaded_tokens(SeqId{3}), stored * block());
  for (int step = 0; step < 24; ++step) {
    ASSERT_EQ(full.size(), resumed.size());
    float max_diff = 0;
    for (size_t i = 0; i < full.size(); ++i) max_diff = std::max(max_diff, std::abs(full[i] - resumed[i]));
    EXPECT_LT(max_diff, 1e-3) << "step " << step;
    const TokenId a = static_cast<TokenId>(argmax(full)), b = static_cast<TokenId>(argmax(resumed));
    ASSERT_EQ(a, b) << "greedy tokens diverge at step " << step;
    kv_->append_tokens(SeqId{2}, std::vector<TokenId>{a});
    kv_->append_tokens(SeqId{3}, std::vector<TokenId>{b});
    full = run(SeqId{2}, 1, LogitsMode::kLast);
    resumed = run(SeqId{3}, 1, LogitsMode::kLast);
  }
}

TEST_F(KvReuseTest, TruncatedReRotatedHistoryKeepsPerplexity) {
  // The first block stays (the attention sink, where a chat's system prompt starts); the oldest
  // blocks after it are dropped: docs/kv-store.md explains why.
  constexpr int64_t kHistory = 1024, kDrop = 512, kEval = 1536;
  const std::vector<TokenId> text = wikitext(20000, kHistory + kEval);
  const int64_t b = block(), stored = kHistory / b, dropped = kDrop / b;
  std::vector<TokenId> truncated(text.begin(), text.begin() + b);  // block 0
  truncated.insert(truncated.end(), text.begin() + b + kDrop, text.end());
  const std::vector<TokenId> eval(text.begin() + kHistory, text.end());
  const int64_t kept_blocks = stored - dropped;  // block 0 and blocks dropped+1 .. stored-1

  ASSERT_TRUE(kv_->add_sequence(SeqId{1}, std::vector<TokenId>(text.begin(), text.begin() + kHistory), "").ok());
  run(SeqId{1}, kHistory, LogitsMode::kNone);
  const std::vector<std::vector<std::byte>> chunks = save(SeqId{1}, stored);
  // NKVT: blocks saved as if they sat at their new positions, so loading leaves the keys rotated
  // for their old ones.
  std::vector<std::vector<std::byte>> not_rerotated = save(SeqId{1}, stored - dropped - 1, dropped + 1);
  not_rerotated.insert(not_rerotated.begin(), chunks[0]);
  kv_->free(SeqId{1});

  std::vector<std::vector<std::byte>> kept = {chunks[0]};
  kept.insert(kept.end(), chunks.begin() + dropped + 1, chunks.end());
  // Scores the continuation after the kept history, which is recomputed (no chunks) or loaded.
  auto score = [&](SeqId seq, const std::vector<std::vector<std::byte>>* source) {
    EXPECT_TRUE(kv_->add_sequence(seq, truncated, "").ok());
    std::vector<KvLoad> loads;
    if (source != nullptr) {
      kv_->set_external_prefix(seq, kept_blocks, /*exact=*/false);
      loads.push_back(load_of(seq, *source, 0, static_cast<size_t>(kept_blocks)));
    } else {
      run(seq, kept_blocks * b, LogitsMode::kNone);
    }
    return perplexity(run(seq, kEval, LogitsMode::kAll, std::move(loads)), eval);
  };
  const double tt = score(SeqId{2}, nullptr);         // recompute the truncated text
  const double ca = score(SeqId{3}, &kept);           // stored KV, re-rotated
  const double nkvt = score(SeqId{4}, &not_rerotated);  // stored KV at its old positions
  std::printf("perplexity over %lld tokens: TT %.4f, CachedAttention %.4f, NKVT %.4f\n",
              static_cast<long long>(kEval - 1), tt, ca, nkvt);
  // The paper reports |CA - TT| <= 0.02 at PPL ~5.5 (LLaMA-7B/13B), 0.4% relative; this 135M model
  // sits near PPL 31, where the same relative gap is ~0.12 absolute. Bound the relative gap.
  EXPECT_LT(std::abs(ca - tt) / tt, 0.0075);
  EXPECT_GT(nkvt, tt * 1.5) << "keys at the wrong positions should hurt";
}

}  // namespace
}  // namespace strata::executor
