// H2O's layer (src/executor/h2o_layer.h) and the received-attention op its heavy hitters come
// from (kernels::aten::attention_received) against plain loops in double precision: the op over
// chunks against whole-prompt sums, a budget that covers the context against full attention, and
// prefill selection plus decode-time eviction against a step-by-step reference of the algorithm.

#include "h2o_layer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "strata/kernels/aten_ops.h"

namespace strata::executor {
namespace {

constexpr int64_t kKvHeads = 2, kGroup = 3, kDim = 8;
const double kScale = 1.0 / std::sqrt(static_cast<double>(kDim));

// Softmax of query head h's logits over the listed tokens of its KV head, in double.
std::vector<double> probabilities(const at::Tensor& q, int64_t h, const at::Tensor& k,
                                  const std::vector<int64_t>& tokens) {
  const int64_t m = h / kGroup;
  std::vector<double> logits;
  for (int64_t t : tokens) {
    double s = 0;
    for (int64_t c = 0; c < kDim; ++c) s += q[h][c].item<double>() * k[t][m][c].item<double>();
    logits.push_back(s * kScale);
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double& l : logits) sum += (l = std::exp(l - top));
  for (double& l : logits) l /= sum;
  return logits;
}

// Attention each prompt token received from the tokens after it, summed over each KV head's
// query heads: [n_kv][n].
std::vector<std::vector<double>> received_by_loops(const at::Tensor& q, const at::Tensor& k) {
  const int64_t n = q.size(0);
  std::vector<std::vector<double>> received(kKvHeads, std::vector<double>(n, 0.0));
  for (int64_t j = 1; j < n; ++j) {
    std::vector<int64_t> context(j + 1);
    for (int64_t t = 0; t <= j; ++t) context[t] = t;
    for (int64_t h = 0; h < kKvHeads * kGroup; ++h) {
      const std::vector<double> p = probabilities(q[j], h, k, context);
      for (int64_t t = 0; t < j; ++t) received[h / kGroup][t] += p[t];
    }
  }
  return received;
}

// The algorithm, one head at a time, over the whole token history k, v [T, n_kv, d].
class ReferenceH2o {
 public:
  ReferenceH2o(int64_t budget, int64_t window) : budget_(budget), window_(window) {}

  void prefill(int64_t n, const std::vector<std::vector<double>>& received) {
    tokens_ = n;
    for (int64_t m = 0; m < kKvHeads; ++m) {
      std::vector<int64_t> older;
      for (int64_t t = 0; t < n; ++t) {
        if (n <= budget_ || t >= n - window_) {
          kept_[m].push_back(t);
        } else {
          older.push_back(t);
        }
      }
      std::stable_sort(older.begin(), older.end(),
                       [&](int64_t a, int64_t b) { return received[m][a] > received[m][b]; });
      if (n > budget_) older.resize(budget_ - window_);
      kept_[m].insert(kept_[m].end(), older.begin(), older.end());
      for (int64_t t : kept_[m]) score_[m][t] = received[m][t];
    }
  }

  // The step of token `tokens_` (its keys and values already in k, v): attention [n_q, d].
  at::Tensor decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const int64_t t_new = tokens_++;
    at::Tensor out = at::zeros({kKvHeads * kGroup, kDim}, at::kDouble);
    for (int64_t m = 0; m < kKvHeads; ++m) {
      kept_[m].push_back(t_new);
      score_[m][t_new] = 0;
      for (int64_t g = 0; g < kGroup; ++g) {
        const int64_t h = m * kGroup + g;
        const std::vector<double> p = probabilities(q, h, k, kept_[m]);
        for (size_t i = 0; i < p.size(); ++i) {
          out[h] += p[i] * v[kept_[m][i]][m].to(at::kDouble);
          if (kept_[m][i] != t_new) score_[m][kept_[m][i]] += p[i];
        }
      }
      if (std::ssize(kept_[m]) > budget_) {
        auto victim = kept_[m].end();
        double lightest = std::numeric_limits<double>::infinity();
        for (auto it = kept_[m].begin(); it != kept_[m].end(); ++it) {
          if (*it < tokens_ - window_ && score_[m][*it] < lightest) {
            lightest = score_[m][*it];
            victim = it;
          }
        }
        kept_[m].erase(victim);
      }
    }
    return out.to(at::kFloat);
  }

 private:
  int64_t budget_, window_, tokens_ = 0;
  std::vector<int64_t> kept_[kKvHeads];
  std::vector<double> score_[kKvHeads] = {std::vector<double>(4096), std::vector<double>(4096)};
};

at::Tensor received_tensor(const std::vector<std::vector<double>>& received) {
  std::vector<at::Tensor> rows;
  for (const auto& r : received) rows.push_back(at::tensor(r, at::kDouble));
  return at::stack(rows).to(at::kFloat);
}

TEST(AttentionReceivedTest, ChunksAddUpToTheWholePromptsLoops) {
  at::manual_seed(3);
  const int64_t n = 13;
  const at::Tensor q = at::randn({n, kKvHeads * kGroup, kDim});
  const at::Tensor k = at::randn({n, kKvHeads, kDim});
  // Two chunks, as chunked prefill computes them: rows [0, 5) then [5, 13).
  at::Tensor sums = at::zeros({kKvHeads * kGroup, n});
  sums.narrow(1, 0, 5) += kernels::aten::attention_received(q.narrow(0, 0, 5), k, 0, kScale);
  sums += kernels::aten::attention_received(q.narrow(0, 5, n - 5), k, 5, kScale);
  const at::Tensor grouped = sums.view({kKvHeads, kGroup, n}).sum(1);
  EXPECT_TRUE(at::allclose(grouped, received_tensor(received_by_loops(q, k)), 1e-5, 1e-5))
      << grouped << received_tensor(received_by_loops(q, k));
  EXPECT_EQ(grouped[0][n - 1].item<float>(), 0.0f);  // the last token: no query after it
}

TEST(H2oLayerTest, ABudgetCoveringTheContextIsFullAttention) {
  at::manual_seed(4);
  const int64_t n = 10, steps = 6;
  const at::Tensor q = at::randn({n + steps, kKvHeads * kGroup, kDim});
  const at::Tensor k = at::randn({n + steps, kKvHeads, kDim});
  const at::Tensor v = at::randn({n + steps, kKvHeads, kDim});
  H2oLayer layer(n + steps, 2, kKvHeads, kDim, at::kFloat, at::kCPU);
  layer.prefill(k.narrow(0, 0, n), v.narrow(0, 0, n),
                received_tensor(received_by_loops(q.narrow(0, 0, n), k.narrow(0, 0, n))));
  for (int64_t t = n; t < n + steps; ++t) {
    const at::Tensor out = layer.decode(q[t], k[t], v[t], kScale);
    // Plain attention over every token so far.
    at::Tensor expected = at::zeros({kKvHeads * kGroup, kDim}, at::kDouble);
    std::vector<int64_t> all(t + 1);
    for (int64_t i = 0; i <= t; ++i) all[i] = i;
    for (int64_t h = 0; h < kKvHeads * kGroup; ++h) {
      const std::vector<double> p = probabilities(q[t], h, k, all);
      for (int64_t i = 0; i <= t; ++i) expected[h] += p[i] * v[i][h / kGroup].to(at::kDouble);
    }
    EXPECT_TRUE(at::allclose(out, expected.to(at::kFloat), 1e-5, 1e-5)) << "step " << t;
  }
  EXPECT_EQ(layer.kept(), n + steps);
  EXPECT_EQ(layer.stats().steps, steps);
  EXPECT_EQ(layer.stats().head_steps, steps * kKvHeads);
}

TEST(H2oLayerTest, KeepsAndEvictsAsTheAlgorithm) {
  for (const auto& [n, budget, window] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {24, 8, 3}, {24, 8, 1}, {6, 8, 2}, {30, 12, 6}}) {
    SCOPED_TRACE("n " + std::to_string(n) + " budget " + std::to_string(budget) + " window " +
                 std::to_string(window));
    at::manual_seed(n + budget + window);
    const int64_t steps = 20;
    const at::Tensor q = at::randn({n + steps, kKvHeads * kGroup, kDim}) * 2;
    const at::Tensor k = at::randn({n + steps, kKvHeads, kDim});
    const at::Tensor v = at::randn({n + steps, kKvHeads, kDim});
    const auto received = received_by_loops(q.narrow(0, 0, n), k.narrow(0, 0, n));
    H2oLayer layer(budget, window, kKvHeads, kDim, at::kFloat, at::kCPU);
    layer.prefill(k.narrow(0, 0, n), v.narrow(0, 0, n), received_tensor(received));
    ReferenceH2o reference(budget, window);
    reference.prefill(n, received);
    for (int64_t t = n; t < n + steps; ++t) {
      const at::Tensor out = layer.decode(q[t], k[t], v[t], kScale);
      const at::Tensor expected = reference.decode(q[t], k, v);
      ASSERT_TRUE(at::allclose(out, expected, 1e-4, 1e-5)) << "step " << t;
      ASSERT_EQ(layer.kept(), std::min(budget, t + 1));
    }
    EXPECT_EQ(layer.tokens(), n + steps);
  }
}

TEST(H2oLayerTest, AHeavyHitterOutlivesTheWindow) {
  // Every query points along one direction and token 2's key is far along it: token 2 takes
  // most of each step's attention, so it is never the lightest and every step returns its value.
  at::manual_seed(5);
  const int64_t n = 12, budget = 4, window = 2;
  at::Tensor q = at::randn({n + 30, kKvHeads * kGroup, kDim}) * 0.1;
  q.select(2, 0).fill_(1.0);
  at::Tensor k = at::randn({n + 30, kKvHeads, kDim}) * 0.1;
  k[2].select(1, 0).fill_(40.0);
  const at::Tensor v = at::randn({n + 30, kKvHeads, kDim});
  H2oLayer layer(budget, window, kKvHeads, kDim, at::kFloat, at::kCPU);
  layer.prefill(k.narrow(0, 0, n), v.narrow(0, 0, n),
                received_tensor(received_by_loops(q.narrow(0, 0, n), k.narrow(0, 0, n))));
  for (int64_t t = n; t < n + 30; ++t) {
    const at::Tensor out = layer.decode(q[t], k[t], v[t], kScale);
    for (int64_t h = 0; h < kKvHeads * kGroup; ++h) {
      ASSERT_TRUE(at::allclose(out[h], v[2][h / kGroup], 1e-3, 1e-3)) << "step " << t;
    }
  }
}

}  // namespace
}  // namespace strata::executor
