// Krul's attention statistics in the executor (src/executor/attention_observer.h) against HF
// transformers' eager attention matrices on the default model (tests/reference/krul_reference.py):
// the prompt observed over several chunks and reduced over the passes that follow, then one
// decode row per step; the split result equals the offline one, over every row and over the rows
// at multiples of 4 (kv_store.krul_row_stride). H2O's stored form of whole chunks, kept a layer
// at a time by the executor, equals the selection over the whole chunks at once.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "paged_runner.h"
#include "strata/executor/executor.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/kv/krul_policy.h"
#include "strata/model/model_source.h"

namespace strata::executor {
namespace {

using kv::krul::AttentionStats;

class KrulExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto source = model::open_model_source(STRATA_TEST_MODEL);
    ASSERT_TRUE(source.ok()) << source.status().to_string();
    source_ = std::move(source).value().release();
    auto executor = Executor::create(*source_, ExecutorOptions{});
    ASSERT_TRUE(executor.ok()) << executor.status().to_string();
    executor_ = std::move(executor).value().release();
  }
  static void TearDownTestSuite() {
    delete executor_;
    delete source_;
  }

  // Runs prompt (in chunks of `chunk` tokens) then the generated tokens one at a time, observing
  // attention as asked; returns the statistics taken at the end.
  std::optional<AttentionStats> run(SeqId seq, const std::vector<TokenId>& prompt,
                                    const std::vector<TokenId>& generated, size_t chunk,
                                    bool observe, int32_t stride = 1) {
    testing::PagedRunner runner(*executor_);
    for (size_t start = 0; start < prompt.size(); start += chunk) {
      const size_t end = std::min(prompt.size(), start + chunk);
      testing::PagedRunner::Step step{seq, {prompt.begin() + start, prompt.begin() + end}};
      step.samples = end == prompt.size();
      step.observe_attention = observe;
      step.observe_row_stride = stride;
      EXPECT_TRUE(runner.run({step}).ok());
    }
    for (TokenId t : generated) {
      testing::PagedRunner::Step step{seq, {t}};
      step.observe_attention = observe;
      step.observe_row_stride = stride;
      EXPECT_TRUE(runner.run({step}).ok());
    }
    return executor_->take_attention_stats(seq);
  }

  static model::ModelSource* source_;
  static Executor* executor_;
};

model::ModelSource* KrulExecutorTest::source_ = nullptr;
Executor* KrulExecutorTest::executor_ = nullptr;

// The executor's statistics over `rows` observed rows against the reference's `ref` (edge_share,
// squared, from HF's matrices), and the same pairs chosen from both. The executor runs the prompt
// in chunks of 48 (several, each reduced over later passes), then one decode row per step.
void expect_reference_statistics(const nlohmann::json& ref, std::optional<AttentionStats> stats,
                                 int64_t rows) {
  ASSERT_TRUE(stats.has_value());
  const int32_t layers = stats->num_layers, heads = stats->num_heads;
  ASSERT_EQ(layers, 30);
  ASSERT_EQ(heads, 9);
  double worst_share = 0, worst_rel = 0;
  for (int32_t i = 0; i < layers; ++i) {
    EXPECT_EQ(stats->observed[i], rows * heads);
    const double share = ref["edge_share"][i].get<double>();
    worst_share = std::max(worst_share, std::abs(stats->edge_share(i) - share));
    for (int32_t j = 0; j < i; ++j) {
      for (int32_t h = 0; h < heads; ++h) {
        const double want = ref["squared"][i][j][h].get<double>();
        const double got = stats->squared_at(i, j, h);
        worst_rel = std::max(worst_rel, std::abs(got - want) / std::max(want, 1e-6));
      }
    }
  }
  std::printf("max |edge share - HF| %.2e, max relative error of squared distances %.2e\n",
              worst_share, worst_rel);
  EXPECT_LT(worst_share, 1e-4);
  EXPECT_LT(worst_rel, 1e-3);
  // The same pairs as from HF's matrices.
  AttentionStats want(layers, heads);
  for (int32_t i = 0; i < layers; ++i) {
    want.edge_mass[i] = ref["edge_share"][i].get<double>();
    want.observed[i] = 1;
    for (int32_t j = 0; j < i; ++j) {
      for (int32_t h = 0; h < heads; ++h)
        want.squared_at(i, j, h) = ref["squared"][i][j][h].get<double>();
    }
  }
  const std::vector<bool> all(layers, true);
  const auto a = kv::krul::select_pairs(*stats, all, 0.5),
             b = kv::krul::select_pairs(want, all, 0.5);
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    EXPECT_EQ(a[p].shallow, b[p].shallow);
    EXPECT_EQ(a[p].deep, b[p].deep);
  }
}

TEST_F(KrulExecutorTest, SplitStatisticsEqualHfAttentionMatrices) {
  std::ifstream in(std::string(STRATA_TEST_DATA_DIR) + "/model/krul/reference.json");
  ASSERT_TRUE(in.good()) << "missing reference; run the krul_reference fixture";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto prompt = ref["prompt_ids"].get<std::vector<TokenId>>();
  const auto generated = ref["generated_ids"].get<std::vector<TokenId>>();
  ASSERT_GT(prompt.size(), 100u);
  const auto total = static_cast<int64_t>(prompt.size() + generated.size());
  {
    SCOPED_TRACE("every row");
    expect_reference_statistics(ref, run(SeqId{1}, prompt, generated, 48, true), total);
  }
  {
    SCOPED_TRACE("rows at multiples of 4 (kv_store.krul_row_stride)");
    const int32_t stride = ref["strided"]["stride"].get<int32_t>();
    expect_reference_statistics(ref["strided"], run(SeqId{5}, prompt, generated, 48, true, stride),
                                (total + stride - 1) / stride);
  }
}

TEST_F(KrulExecutorTest, OnlyChunksThatAskAreObservedAndTakeForgets) {
  const std::vector<TokenId> prompt = {1, 504, 3458, 282, 260, 1345, 30, 378, 314, 2133};
  EXPECT_FALSE(run(SeqId{2}, prompt, {42, 43}, 4, false).has_value());
  ASSERT_TRUE(run(SeqId{3}, prompt, {42, 43}, 4, true).has_value());
  EXPECT_FALSE(executor_->take_attention_stats(SeqId{3}).has_value());
}

TEST_F(KrulExecutorTest, ObservationNeedsTheBasePages) {
  testing::PagedRunner runner(*executor_);
  testing::PagedRunner::Step step{SeqId{4}, {1, 2, 3, 4}};
  step.layout.shared_with.assign(30, -1);
  step.layout.shared_with[1] = 0;
  step.observe_attention = true;
  StatusOr<ForwardResult> result = runner.run({step});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("base pages"), std::string::npos)
      << result.status().to_string();
}

TEST_F(KrulExecutorTest, HeavyHittersKeptLayerByLayerEqualTheWholeSelection) {
  const kv::KvGeometry& g = executor_->kv_geometry();
  const int64_t n = 5, kept = 3, bytes = executor_->kv_chunk_bytes();
  at::manual_seed(3);
  const at::Tensor chunks =
      at::randn({n, g.num_layers, 2, g.num_kv_heads, g.block_size_tokens, g.head_dim})
          .to(kernels::aten::scalar_type(executor_->dtype()));
  ASSERT_EQ(chunks.numel() * chunks.element_size(), n * bytes);
  // The mass of 70 of the 80 tokens: the last 10 were not observed.
  const at::Tensor mass = at::rand({70, g.num_layers, g.num_kv_heads});
  std::vector<const std::byte*> in;
  for (int64_t i = 0; i < n; ++i) in.push_back(static_cast<const std::byte*>(chunks[i].data_ptr()));
  at::Tensor got = at::zeros_like(chunks.narrow(0, 0, kept));
  std::vector<std::byte*> out;
  for (int64_t j = 0; j < kept; ++j) out.push_back(static_cast<std::byte*>(got[j].data_ptr()));
  ASSERT_TRUE(
      executor_
          ->keep_heavy_hitters({mass.data_ptr<float>(), static_cast<size_t>(mass.numel())}, in, out)
          .ok());
  EXPECT_TRUE(at::equal(got, kernels::aten::h2o_keep_chunks(chunks, mass, kept)));
  // A mass of another shape is refused.
  EXPECT_EQ(executor_->keep_heavy_hitters({mass.data_ptr<float>(), 7}, in, out).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::executor
