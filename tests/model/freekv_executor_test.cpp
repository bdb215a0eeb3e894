// FreeKV in the executor (docs/freekv.md) on the real model, against the same executor without
// it over the same tokens (a WikiText-2 prompt, then its next tokens forced one per decode step):
// - a budget that covers the context decodes like the pool (retrieval selects every page);
// - a small budget keeps the text's likelihood close to the pool's, with every decode step of
//   every retrieving layer counted;
// - a context below min_context_tokens never leaves the pool: the pool's logits exactly;
// - H2O (freekv.method h2o): a budget covering the context decodes like the pool; a small one
//   evicts (its quality beside StreamingLLM and FreeKV's is in the comments).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "logit_checks.h"
#include "paged_runner.h"
#include "strata/executor/executor.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::executor {
namespace {

using testing::max_abs_diff;
using testing::min_cosine;
using testing::same_argmax;

constexpr int64_t kLayers = 30;  // SmolLM2-135M
constexpr int kPrompt = 600, kSteps = 12;

class FreeKvExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    StatusOr<std::unique_ptr<model::ModelSource>> source =
        model::open_model_source(STRATA_TEST_MODEL);
    ASSERT_TRUE(source.ok()) << source.status().to_string();
    source_ = std::move(source).value().release();
    std::unique_ptr<tokenizer::Tokenizer> tok =
        tokenizer::Tokenizer::from_gguf(*source_->gguf()).value();
    std::ifstream in(STRATA_SOURCE_DIR "/../shared/data/ppl/wikitext-2-raw-v1_test.raw");
    std::stringstream text;
    text << in.rdbuf();
    tokens_ = new std::vector<TokenId>(
        tok->encode(text.str().substr(30000, 8 * (kPrompt + kSteps)), false));
    ASSERT_GE(tokens_->size(), size_t{kPrompt + kSteps}) << "WikiText-2 not found or too short";
    tokens_->resize(kPrompt + kSteps + 1);
    std::unique_ptr<Executor> plain = make(FreeKvConfig{});
    ASSERT_NE(plain, nullptr);
    expected_ = new std::vector<std::vector<float>>(run(*plain, nullptr));
  }
  static void TearDownTestSuite() {
    delete tokens_;
    delete expected_;
    delete source_;
  }

  static std::unique_ptr<Executor> make(const FreeKvConfig& freekv) {
    ExecutorOptions options;
    options.freekv = freekv;
    options.max_context_tokens = 2048;
    StatusOr<std::unique_ptr<Executor>> executor = Executor::create(*source_, options);
    EXPECT_TRUE(executor.ok()) << executor.status().to_string();
    return executor.ok() ? std::move(executor).value() : nullptr;
  }

  static FreeKvConfig freekv(int64_t sink, int64_t window, int64_t budget, int64_t min_context) {
    return FreeKvConfig{.enabled = true,
                        .page_tokens = 16,
                        .budget_tokens = budget,
                        .sink_tokens = sink,
                        .window_tokens = window,
                        .tau = 0.8,
                        .min_context_tokens = min_context};
  }

  // Last-position logits of each step: the prompt, then kSteps forced tokens. `moved` counts the
  // passes that took the sequence off the pool.
  static std::vector<std::vector<float>> run(Executor& executor, int* moved) {
    testing::PagedRunner runner(executor);
    std::vector<std::vector<float>> logits;
    for (int step = 0; step <= kSteps; ++step) {
      const std::vector<TokenId> tokens =
          step == 0 ? std::vector<TokenId>(tokens_->begin(), tokens_->begin() + kPrompt)
                    : std::vector<TokenId>{(*tokens_)[kPrompt + step - 1]};
      StatusOr<ForwardResult> out = runner.run({{SeqId{1}, tokens, LogitsMode::kLast}});
      EXPECT_TRUE(out.ok()) << out.status().to_string();
      if (!out.ok()) break;
      if (moved) *moved += static_cast<int>(out->compressed.size());
      logits.push_back(out->logits);
    }
    return logits;
  }

  // Mean negative log-likelihood of the text's next token over the steps.
  static double nll(const std::vector<std::vector<float>>& logits) {
    double sum = 0;
    for (size_t s = 0; s < logits.size(); ++s) {
      const std::vector<float>& row = logits[s];
      const double top = *std::max_element(row.begin(), row.end());
      double z = 0;
      for (float x : row) z += std::exp(double(x) - top);
      sum += top + std::log(z) - row[(*tokens_)[kPrompt + s]];
    }
    return sum / logits.size();
  }

  static model::ModelSource* source_;
  static std::vector<TokenId>* tokens_;  // the prompt, then the forced tokens, then one more
  static std::vector<std::vector<float>>* expected_;
};

model::ModelSource* FreeKvExecutorTest::source_ = nullptr;
std::vector<TokenId>* FreeKvExecutorTest::tokens_ = nullptr;
std::vector<std::vector<float>>* FreeKvExecutorTest::expected_ = nullptr;

TEST_F(FreeKvExecutorTest, ABudgetCoveringTheContextDecodesLikeThePool) {
  std::unique_ptr<Executor> executor = make(freekv(32, 32, 32 + 32 + 16 * 64, 64));
  ASSERT_NE(executor, nullptr);
  int moved = 0;
  const auto got = run(*executor, &moved);
  EXPECT_EQ(moved, 1);  // after the prompt
  EXPECT_LT(max_abs_diff(got, *expected_), 1e-3);
  EXPECT_EQ(same_argmax(got, *expected_), kSteps + 1);
  const FreeKvCounts counts = executor->freekv_counts();
  EXPECT_EQ(counts.steps, kSteps * (kLayers - 1));
}

TEST_F(FreeKvExecutorTest, ASmallBudgetStaysClose) {
  // 4 of the prompt's 33 pages selected per layer and KV head, beside 32 sink and 64 window tokens.
  std::unique_ptr<Executor> executor = make(freekv(32, 64, 32 + 64 + 16 * 4, 64));
  ASSERT_NE(executor, nullptr);
  int moved = 0;
  const auto got = run(*executor, &moved);
  EXPECT_EQ(moved, 1);
  const double diff = max_abs_diff(got, *expected_);
  EXPECT_GT(diff, 1e-3);  // it does retrieve: not every page is read
  const int same = same_argmax(got, *expected_);
  const double cosine = min_cosine(got, *expected_);
  std::printf(
      "small budget: max logit diff %.4f, min cosine %.5f, same argmax %d of %d, "
      "nll %.4f against the pool's %.4f\n",
      diff, cosine, same, kSteps + 1, nll(got), nll(*expected_));
  // Measured: 13 of 13 and +0.25 nats. Selecting the lowest-scored pages instead (a tested
  // mutation) gives 4 of 13 and +4.4 nats.
  EXPECT_GE(same, kSteps - 1);
  EXPECT_LT(nll(got), nll(*expected_) + 0.5);
  const FreeKvCounts counts = executor->freekv_counts();
  EXPECT_EQ(counts.steps, kSteps * (kLayers - 1));
  EXPECT_EQ(counts.head_steps, counts.steps * 3);        // 3 KV heads
  EXPECT_GE(counts.corrected_heads, (kLayers - 1) * 3);  // the first step corrects every head
  EXPECT_GT(counts.recalled_pages, 0);
  RecordProperty("max_logit_diff", std::to_string(diff));
  RecordProperty("same_argmax", same);
  RecordProperty("corrected_share",
                 std::to_string(double(counts.corrected_heads) / counts.head_steps));
}

TEST_F(FreeKvExecutorTest, H2oWithABudgetCoveringTheContextDecodesLikeThePool) {
  FreeKvConfig config = freekv(32, 32, 1024, 64);
  config.method = FreeKvMethod::kH2o;
  std::unique_ptr<Executor> executor = make(config);
  ASSERT_NE(executor, nullptr);
  int moved = 0;
  const auto got = run(*executor, &moved);
  EXPECT_EQ(moved, 1);
  EXPECT_LT(max_abs_diff(got, *expected_), 1e-3);
  EXPECT_EQ(same_argmax(got, *expected_), kSteps + 1);
  const FreeKvCounts counts = executor->freekv_counts();
  EXPECT_EQ(counts.steps, kSteps * (kLayers - 1));
  EXPECT_EQ(counts.recalled_pages, 0);
}

TEST_F(FreeKvExecutorTest, H2oWithASmallBudgetEvicts) {
  // 160 tokens of the 600-token prompt per layer and KV head: 64 recent and 96 heavy hitters.
  FreeKvConfig h2o = freekv(32, 64, 160, 64);
  h2o.method = FreeKvMethod::kH2o;
  std::unique_ptr<Executor> executor = make(h2o);
  ASSERT_NE(executor, nullptr);
  int moved = 0;
  const auto got = run(*executor, &moved);
  EXPECT_EQ(moved, 1);
  const double diff = max_abs_diff(got, *expected_);
  EXPECT_GT(diff, 1e-3);  // it does evict
  std::printf("160-token budget: H2O nll %.4f against the pool's %.4f (same argmax %d of %d)\n",
              nll(got), nll(*expected_), same_argmax(got, *expected_), kSteps + 1);
  // Measured over these 12 forced tokens: the pool 0.60 nats, H2O 4.75, and at the same budget
  // StreamingLLM (96 sink, 64 window) 5.12, FreeKV (32 sink, 64 window, 4 pages) 0.85. The
  // continuation needs particular earlier tokens, which FreeKV's query-driven retrieval finds and a
  // static choice does not: keeping the prompt's *lightest* tokens instead of its heaviest (a
  // mutation tried) gives 4.11. So this test checks the plumbing (every step of every later layer
  // runs H2O, logits stay finite); the algorithm is checked step by step against a reference in
  // h2o_layer_test, its quality by the perplexity runs in docs/results/cpu-freekv.md.
  for (const auto& row : got) {
    EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); }));
  }
  const FreeKvCounts counts = executor->freekv_counts();
  EXPECT_EQ(counts.steps, kSteps * (kLayers - 1));
  EXPECT_EQ(counts.head_steps, counts.steps * 3);
}

TEST_F(FreeKvExecutorTest, AContextBelowTheThresholdStaysOnThePool) {
  std::unique_ptr<Executor> executor = make(freekv(32, 32, 32 + 32 + 16 * 4, 2048));
  ASSERT_NE(executor, nullptr);
  int moved = 0;
  const auto got = run(*executor, &moved);
  EXPECT_EQ(moved, 0);
  EXPECT_EQ(max_abs_diff(got, *expected_), 0.0);
  EXPECT_EQ(executor->freekv_counts().steps, 0);
}

// freekv.host_bytes below one sequence's reservation: the context that reached the threshold
// stays on the pool (the pool's logits exactly) and is counted refused.
TEST_F(FreeKvExecutorTest, ASequenceTheHostBudgetCannotHoldStaysOnThePool) {
  FreeKvConfig config = freekv(32, 32, 32 + 32 + 16 * 4, 64);
  config.host_bytes = 1 << 20;  // SmolLM2's 30 layers x 2,048 tokens take about 92 MiB
  std::unique_ptr<Executor> executor = make(config);
  ASSERT_NE(executor, nullptr);
  int moved = 0;
  const auto got = run(*executor, &moved);
  EXPECT_EQ(moved, 0);
  EXPECT_EQ(max_abs_diff(got, *expected_), 0.0);
  const FreeKvCounts counts = executor->freekv_counts();
  EXPECT_EQ(counts.steps, 0);
  EXPECT_EQ(counts.refused_sequences, 1);  // asked again at every pass past it, counted once
}

TEST_F(FreeKvExecutorTest, BadOptionsAreRefused) {
  ExecutorOptions options;
  options.freekv = freekv(30, 32, 1024, 64);  // sink not whole pages
  EXPECT_FALSE(Executor::create(*source_, options).ok());
  options.freekv = freekv(32, 32, 60, 64);  // less than sink + window
  EXPECT_FALSE(Executor::create(*source_, options).ok());
  options.freekv = freekv(32, 32, 1024, 64);
  options.leankv.enabled = true;
  EXPECT_FALSE(Executor::create(*source_, options).ok());
}

}  // namespace
}  // namespace strata::executor
