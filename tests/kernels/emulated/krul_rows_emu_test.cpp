// Krul's decode-row statistics kernel (kernels/krul/accumulate_rows.cu) under the emulator
// against the libtorch reference (kernels::aten::krul_accumulate, float64), every schedule:
// squared distances between layers per head and I-R mass per layer, added to compensated float32
// accumulators that already hold values, over several steps. Grid: 1 and 3 sequences x 2, 5 and 30
// layers x 1 and 9 heads; ragged lengths from 1 to 300 positions; positions past a row's length
// hold NaN (read them and the result is NaN).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>

#include "emulated_test_util.h"
#include "launch_params.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using Params = std::tuple<int64_t, int64_t, int64_t>;  // sequences, layers, heads

class KrulRowsEmuTest : public ::testing::TestWithParam<Params> {};

TEST_P(KrulRowsEmuTest, AccumulatesLikeTheReference) {
  const auto [seqs, layers, heads] = GetParam();
  at::manual_seed(seqs * 100 + layers * 10 + heads);
  const int64_t stride = 304;
  const int64_t lengths_of[] = {300, 1, 7};
  at::Tensor lengths = at::empty({seqs}, at::kLong);
  at::Tensor rows = at::full({seqs, layers, heads, stride}, NAN);
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t len = lengths_of[s % 3];
    lengths[s] = len;
    rows[s].narrow(2, 0, len).copy_(at::softmax(3 * at::randn({layers, heads, len}), -1));
  }
  // Accumulators holding earlier steps' sums (compensation 0).
  at::Tensor squared0 = at::zeros({seqs, layers, layers, heads, 2});
  at::Tensor edge0 = at::zeros({seqs, layers, 2});
  squared0.select(-1, 0).uniform_(0, 50);
  edge0.select(-1, 0).uniform_(0, 50);
  constexpr int kSteps = 3;  // the same rows added 3 times: a sum of sums

  at::Tensor want_squared = squared0.select(-1, 0).to(at::kDouble);
  at::Tensor want_edge = edge0.select(-1, 0).to(at::kDouble);
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t len = lengths[s].item<int64_t>();
    kv::krul::AttentionStats stats(static_cast<int32_t>(layers), static_cast<int32_t>(heads));
    aten::krul_accumulate(rows[s].narrow(2, 0, len).unsqueeze(2), at::full({1}, len, at::kLong),
                          stats);
    for (int32_t i = 0; i < layers; ++i) {
      want_edge[s][i] += kSteps * stats.edge_mass[i];
      for (int32_t j = 0; j < i; ++j) {
        for (int32_t h = 0; h < heads; ++h) {
          want_squared[s][i][j][h] += kSteps * stats.squared_at(i, j, h);
        }
      }
    }
  }
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor squared = squared0.clone(), edge = edge0.clone();
        const KrulRowsParams p = krul_rows_params(rows, lengths, squared, edge);
        for (int step = 0; step < kSteps; ++step) launch_krul_accumulate_rows(p, nullptr);
        auto total = [](const at::Tensor& acc) {
          return (acc.select(-1, 0).to(at::kDouble) - acc.select(-1, 1).to(at::kDouble)).flatten();
        };
        return at::cat({total(squared), total(edge)});
      },
      at::cat({want_squared.flatten(), want_edge.flatten()}), 1e-5, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Grid, KrulRowsEmuTest,
                         ::testing::Combine(::testing::Values<int64_t>(1, 3),
                                            ::testing::Values<int64_t>(2, 5, 30),
                                            ::testing::Values<int64_t>(1, 9)));

}  // namespace
}  // namespace strata::kernels
