// FreeKV's operations and its per-layer speculative retrieval (src/executor/freekv_layer.h)
// against plain computations: selection against loops over the paper's formula, a budget that
// covers the context against full attention, tau above 1 against synchronous retrieval, and a
// poisoned back buffer (the recall in flight) that no attention may read; on a CUDA device
// (scripts/gpu-check.sh; skipped without one) the layer against the CPU layer.

#include "freekv_layer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "strata/kernels/freekv_ops.h"

namespace strata::executor {
namespace {

namespace ka = kernels::aten;

constexpr int64_t kKvHeads = 2, kGroup = 3, kDim = 16, kPage = 4;
const double kScale = 1.0 / std::sqrt(static_cast<double>(kDim));

// Plain attention of q [n_q, d] over keys/values [t, n_kv, d] (per KV head the listed token
// indices, all when `tokens` is empty).
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::vector<std::vector<int64_t>>& tokens = {}) {
  std::vector<at::Tensor> out;
  for (int64_t h = 0; h < q.size(0); ++h) {
    const int64_t m = h / kGroup;
    at::Tensor km = k.select(1, m), vm = v.select(1, m);
    if (!tokens.empty()) {
      const at::Tensor index = at::tensor(tokens[m], at::kLong);
      km = km.index_select(0, index);
      vm = vm.index_select(0, index);
    }
    const at::Tensor p = at::softmax(at::mv(km.to(at::kDouble), q[h].to(at::kDouble)) * kScale, 0);
    out.push_back(at::mv(vm.to(at::kDouble).t(), p));
  }
  return at::stack(out).to(at::kFloat);
}

TEST(FreeKvOpsTest, SelectionFollowsThePapersFormula) {
  at::manual_seed(1);
  const int64_t pages = 11, top_k = 4;
  const at::Tensor keys = at::randn({pages, kKvHeads, kPage, kDim});
  auto [kmin, kmax] = ka::freekv_summaries(keys);
  EXPECT_TRUE(at::equal(kmin, std::get<0>(keys.min(2))));
  EXPECT_TRUE(at::equal(kmax, std::get<0>(keys.max(2))));
  const at::Tensor q = at::randn({kKvHeads * kGroup, kDim});
  const at::Tensor selected = ka::freekv_select(q, kmin, kmax, top_k, kScale);
  ASSERT_EQ(selected.sizes(), (std::vector<int64_t>{kKvHeads, top_k}));
  for (int64_t m = 0; m < kKvHeads; ++m) {
    std::vector<double> score(pages, 0.0);
    for (int64_t g = 0; g < kGroup; ++g) {
      const int64_t h = m * kGroup + g;
      std::vector<double> bound(pages);
      for (int64_t j = 0; j < pages; ++j) {
        double s = 0;
        for (int64_t c = 0; c < kDim; ++c) {
          const double qc = q[h][c].item<double>();
          s += std::max(qc * kmin[j][m][c].item<double>(), qc * kmax[j][m][c].item<double>());
        }
        bound[j] = s * kScale;
      }
      const double top = *std::max_element(bound.begin(), bound.end());
      double sum = 0;
      for (double& b : bound) sum += (b = std::exp(b - top));
      for (int64_t j = 0; j < pages; ++j) score[j] += bound[j] / sum / kGroup;
    }
    std::vector<int64_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    order.resize(top_k);
    std::sort(order.begin(), order.end());
    for (int64_t i = 0; i < top_k; ++i) EXPECT_EQ(selected[m][i].item<int64_t>(), order[i]);
  }
  // Fewer pages than the budget: every page.
  EXPECT_EQ(ka::freekv_select(q, kmin, kmax, 100, kScale).size(1), pages);
}

TEST(FreeKvOpsTest, QuerySimilarityIsTheGroupMeanCosine) {
  at::manual_seed(2);
  const at::Tensor q = at::randn({kKvHeads * kGroup, kDim});
  const at::Tensor prev = at::randn({kKvHeads * kGroup, kDim});
  const at::Tensor got = ka::freekv_query_similarity(q, prev, kKvHeads);
  for (int64_t m = 0; m < kKvHeads; ++m) {
    double mean = 0;
    for (int64_t g = 0; g < kGroup; ++g) {
      const at::Tensor a = q[m * kGroup + g].to(at::kDouble),
                       b = prev[m * kGroup + g].to(at::kDouble);
      mean += (a.dot(b) / (a.norm() * b.norm())).item<double>() / kGroup;
    }
    EXPECT_NEAR(got[m].item<double>(), mean, 1e-6);
  }
}

TEST(FreeKvLayerTest, OptionsAreValidated) {
  FreeKvConfig o{.page_tokens = 4, .budget_tokens = 20, .sink_tokens = 8, .window_tokens = 8};
  EXPECT_TRUE(validate(o).ok());
  o.sink_tokens = 6;
  EXPECT_FALSE(validate(o).ok());  // not whole pages
  o.sink_tokens = 8;
  o.budget_tokens = 16;
  EXPECT_TRUE(validate(o).ok());  // no page selected: StreamingLLM
  o.budget_tokens = 15;
  EXPECT_FALSE(validate(o).ok());  // less than sink + window
  o.page_tokens = 0;
  EXPECT_FALSE(validate(o).ok());
}

// A prompt and decode steps of random keys, values and queries; each decode query is the last
// one plus a perturbation of `drift`, so that adjacent queries are similar as the paper finds.
struct Trace {
  at::Tensor k, v;            // [prompt + steps, n_kv, d]
  std::vector<at::Tensor> q;  // per step [n_q, d]
  int64_t prompt = 0;
};

Trace make_trace(int64_t prompt, int64_t steps, double drift, uint64_t seed) {
  at::manual_seed(seed);
  Trace r;
  r.prompt = prompt;
  r.k = at::randn({prompt + steps, kKvHeads, kDim});
  r.v = at::randn({prompt + steps, kKvHeads, kDim});
  at::Tensor q = at::randn({kKvHeads * kGroup, kDim});
  for (int64_t i = 0; i < steps; ++i) {
    q = q + drift * at::randn_like(q);
    r.q.push_back(q.clone());
  }
  return r;
}

// The layer's outputs over the trace, its inputs moved to `device` and the outputs back.
std::vector<at::Tensor> run_layer(FreeKvLayer& layer, const Trace& r,
                                  at::Device device = at::kCPU) {
  const at::Tensor k = r.k.to(device), v = r.v.to(device);
  layer.prefill(k.narrow(0, 0, r.prompt), v.narrow(0, 0, r.prompt));
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < r.q.size(); ++i) {
    const int64_t t = r.prompt + static_cast<int64_t>(i);
    out.push_back(layer.decode(r.q[i].to(device), k[t], v[t], kScale).cpu());
  }
  return out;
}

// The largest difference over all steps; NaN anywhere (a poisoned read) is infinite.
double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double step = (a[i] - b[i]).abs().max().item<double>();
    d = std::isnan(step) ? INFINITY : std::max(d, step);
  }
  return d;
}

class FullBudgetTest : public ::testing::TestWithParam<double> {};

// A budget covering the whole context equals full attention, whatever tau (speculation reads
// the previous step's pages, which are all of them).
TEST_P(FullBudgetTest, EqualsFullAttention) {
  const FreeKvConfig o{.page_tokens = kPage,
                       .budget_tokens = 8 + 8 + 400,
                       .sink_tokens = 8,
                       .window_tokens = 8,
                       .tau = GetParam()};
  const Trace r = make_trace(37, 40, 0.3, 3);
  RecallWorker worker;  // outlives the layers
  FreeKvLayer layer(o, kKvHeads, kDim, at::kFloat, worker);
  layer.poison_back_buffer_for_testing();
  const std::vector<at::Tensor> got = run_layer(layer, r);
  std::vector<at::Tensor> want;
  for (size_t i = 0; i < r.q.size(); ++i) {
    const int64_t n = r.prompt + static_cast<int64_t>(i) + 1;
    want.push_back(attend(r.q[i], r.k.narrow(0, 0, n), r.v.narrow(0, 0, n)));
  }
  EXPECT_LT(max_diff(got, want), 1e-5);
  EXPECT_EQ(layer.tokens(), 77);
}

INSTANTIATE_TEST_SUITE_P(Tau, FullBudgetTest, ::testing::Values(-2.0, 0.8, 2.0));

// Synchronous retrieval, computed from scratch each step: the sink, the pages that left the
// window before this step's attention (a window of W + 1 to W + p tokens), selected with this
// step's query, and the window.
std::vector<at::Tensor> synchronous(const Trace& r, const FreeKvConfig& o) {
  const int64_t p = o.page_tokens, s = o.sink_tokens, w = o.window_tokens;
  const int64_t slots = (o.budget_tokens - s - w) / p;
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < r.q.size(); ++i) {
    const int64_t n = r.prompt + static_cast<int64_t>(i) + 1;
    const int64_t rest = n - s;
    const int64_t pages = rest > w ? (rest - w + p - 1) / p - 1 : 0;
    std::vector<std::vector<int64_t>> tokens(kKvHeads);
    for (int64_t t = 0; t < s; ++t) {
      for (auto& list : tokens) list.push_back(t);
    }
    if (pages > 0) {
      const at::Tensor keys =
          r.k.narrow(0, s, pages * p).view({pages, p, kKvHeads, kDim}).permute({0, 2, 1, 3});
      auto [kmin, kmax] = ka::freekv_summaries(keys);
      const at::Tensor selected = ka::freekv_select(r.q[i], kmin, kmax, slots, kScale);
      for (int64_t m = 0; m < kKvHeads; ++m) {
        for (int64_t j = 0; j < selected.size(1); ++j) {
          const int64_t page = selected[m][j].item<int64_t>();
          for (int64_t t = 0; t < p; ++t) tokens[m].push_back(s + page * p + t);
        }
      }
    }
    for (int64_t t = s + pages * p; t < n; ++t) {
      for (auto& list : tokens) list.push_back(t);
    }
    out.push_back(attend(r.q[i], r.k, r.v, tokens));
  }
  return out;
}

TEST(FreeKvLayerTest, TauAboveOneIsSynchronousRetrieval) {
  const FreeKvConfig o{.page_tokens = kPage,
                       .budget_tokens = 4 + 8 + 12,
                       .sink_tokens = 4,
                       .window_tokens = 8,
                       .tau = 1.5};
  const Trace r = make_trace(61, 50, 0.5, 4);
  RecallWorker worker;  // outlives the layers
  FreeKvLayer layer(o, kKvHeads, kDim, at::kFloat, worker);
  layer.poison_back_buffer_for_testing();
  const std::vector<at::Tensor> got = run_layer(layer, r);
  EXPECT_LT(max_diff(got, synchronous(r, o)), 1e-5);
  const FreeKvCounts stats = layer.stats();
  EXPECT_EQ(stats.corrected_heads, stats.head_steps);
  EXPECT_EQ(stats.head_steps, 50 * kKvHeads);
  // Nothing is recalled ahead: every recall is on the step thread, from the host pages.
  EXPECT_EQ(stats.reused_pages, 0);
  EXPECT_GT(stats.recall_seconds, 0.0);
  EXPECT_EQ(stats.recall_exposed_seconds, stats.recall_seconds);
}

// Below tau nothing is corrected after the first step: attention reads the pages selected one
// step earlier, which differ from synchronous retrieval's at some steps; pages both steps
// select are copied from the front buffer, not recalled again. A poisoned back buffer changes
// nothing.
TEST(FreeKvLayerTest, SpeculationReadsThePreviousStepsPages) {
  const FreeKvConfig o{.page_tokens = kPage,
                       .budget_tokens = 4 + 8 + 12,
                       .sink_tokens = 4,
                       .window_tokens = 8,
                       .tau = -2.0};
  const Trace r = make_trace(61, 50, 1.0, 5);
  RecallWorker worker;  // outlives the layers
  FreeKvLayer clean(o, kKvHeads, kDim, at::kFloat, worker);
  const std::vector<at::Tensor> got = run_layer(clean, r);
  FreeKvLayer poisoned(o, kKvHeads, kDim, at::kFloat, worker);
  poisoned.poison_back_buffer_for_testing();
  const std::vector<at::Tensor> also = run_layer(poisoned, r);
  EXPECT_EQ(max_diff(got, also), 0.0);
  EXPECT_GT(max_diff(got, synchronous(r, o)), 1e-3);
  const FreeKvCounts stats = clean.stats();
  EXPECT_EQ(stats.corrected_heads, kKvHeads);  // the first step only
  EXPECT_GT(stats.reused_pages, 0);
  EXPECT_GT(stats.recalled_pages, 0);
  EXPECT_GT(stats.recall_seconds, 0.0);
}

// A budget of sink + window selects no page: StreamingLLM, attention over the first S and the
// last W..W+p-1 tokens only.
TEST(FreeKvLayerTest, NoPageLeftIsStreamingLlm) {
  const FreeKvConfig o{.page_tokens = kPage,
                       .budget_tokens = 4 + 8,
                       .sink_tokens = 4,
                       .window_tokens = 8,
                       .tau = 0.8};
  const Trace r = make_trace(61, 20, 0.5, 6);
  RecallWorker worker;  // outlives the layers
  FreeKvLayer layer(o, kKvHeads, kDim, at::kFloat, worker);
  const std::vector<at::Tensor> got = run_layer(layer, r);
  std::vector<at::Tensor> want;
  for (size_t i = 0; i < r.q.size(); ++i) {
    const int64_t n = r.prompt + static_cast<int64_t>(i) + 1;
    const int64_t pages = (n - 4 - 8 + kPage - 1) / kPage - 1;
    std::vector<int64_t> tokens = {0, 1, 2, 3};
    for (int64_t t = 4 + pages * kPage; t < n; ++t) tokens.push_back(t);
    want.push_back(attend(r.q[i], r.k, r.v, {tokens, tokens}));
  }
  EXPECT_LT(max_diff(got, want), 1e-5);
  EXPECT_EQ(layer.stats().recalled_pages, 0);
}

// A recall that throws on the recall thread fails the next step on the step thread (instead of
// ending the process), and the layer still goes away cleanly.
TEST(FreeKvLayerTest, AFailedRecallFailsTheNextStep) {
  const FreeKvConfig o{.page_tokens = kPage,
                       .budget_tokens = 4 + 8 + 12,
                       .sink_tokens = 4,
                       .window_tokens = 8,
                       .tau = 0.8};
  const Trace r = make_trace(61, 3, 0.5, 9);
  RecallWorker worker;  // outlives the layer
  FreeKvLayer layer(o, kKvHeads, kDim, at::kFloat, worker);
  layer.fail_recalls_for_testing();
  layer.prefill(r.k.narrow(0, 0, r.prompt), r.v.narrow(0, 0, r.prompt));
  layer.decode(r.q[0], r.k[r.prompt], r.v[r.prompt], kScale);  // posts the failing recall
  try {
    layer.decode(r.q[1], r.k[r.prompt + 1], r.v[r.prompt + 1], kScale);
    FAIL() << "the step after a failed recall returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "recall failed (injected)");
  }
}

// On a CUDA device the layer gives the CPU layer's outputs: host pages in pinned memory, each
// recall's blocks copied up and converted on a copy stream behind events, the back buffer
// poisoned before every attention. float32 (selection and attention served by libtorch on CUDA,
// the offload and recall by Strata's kernels) and bfloat16 at head_dim 64 (every FreeKV kernel).
TEST(FreeKvLayerTest, OnCudaAttendsLikeOnTheCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const FreeKvConfig o{.page_tokens = kPage,
                       .budget_tokens = 4 + 8 + 12,
                       .sink_tokens = 4,
                       .window_tokens = 8,
                       .tau = 0.8};
  const Trace r = make_trace(61, 50, 0.5, 7);
  RecallWorker worker;  // outlives the layers
  FreeKvLayer cpu(o, kKvHeads, kDim, at::kFloat, worker);
  FreeKvLayer cuda(o, kKvHeads, kDim, at::kFloat, worker, FreeKvDevice{at::Device(at::kCUDA, 0)});
  cuda.poison_back_buffer_for_testing();
  EXPECT_LT(max_diff(run_layer(cpu, r), run_layer(cuda, r, at::Device(at::kCUDA, 0))), 1e-5);
  EXPECT_EQ(cuda.stats().recalled_pages, cpu.stats().recalled_pages);
  EXPECT_EQ(cuda.stats().reused_pages, cpu.stats().reused_pages);

  // bfloat16, head_dim 64: the CUDA kernels throughout.
  at::manual_seed(8);
  Trace wide;
  wide.prompt = 61;
  wide.k = at::randn({111, kKvHeads, 64}).to(at::kBFloat16);
  wide.v = at::randn({111, kKvHeads, 64}).to(at::kBFloat16);
  at::Tensor q = at::randn({kKvHeads * kGroup, 64});
  for (int i = 0; i < 50; ++i)
    wide.q.push_back((q = q + 0.5 * at::randn_like(q)).to(at::kBFloat16));
  FreeKvLayer cpu_bf16(o, kKvHeads, 64, at::kBFloat16, worker);
  FreeKvLayer cuda_bf16(o, kKvHeads, 64, at::kBFloat16, worker,
                        FreeKvDevice{at::Device(at::kCUDA, 0)});
  cuda_bf16.poison_back_buffer_for_testing();
  EXPECT_LT(
      max_diff(run_layer(cpu_bf16, wide), run_layer(cuda_bf16, wide, at::Device(at::kCUDA, 0))),
      3e-2);
}

}  // namespace
}  // namespace strata::executor
