// rms_norm_kernel under the emulator: tests/kernels/rms_norm_test.cpp's reference and grid
// (dtypes; hidden 64, 1000, 4096: one partial warp, a ragged and a full 1024-thread block; rows
// 1 and 7) under every schedule.

#include <tuple>

#include "elementwise_reference.h"
#include "emulated_ops.h"
#include "emulated_test_util.h"
#include "kernel_tolerance.h"

namespace strata::kernels {
namespace {

class RmsNormEmuTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t>> {};

TEST_P(RmsNormEmuTest, MatchesLibtorch) {
  const auto [dtype, hidden, rows] = GetParam();
  at::manual_seed(hidden * 131 + rows);
  const auto opts = at::TensorOptions().dtype(dtype);
  const at::Tensor x = at::randn({rows, hidden}, opts) * 3;
  const at::Tensor w = at::randn({hidden}, opts);
  const at::Tensor ref = testing::reference_rms_norm(x, w, 1e-5);
  const auto tol = testing::tolerance_for(dtype);
  testing::expect_schedule_invariant_match([&] { return testing::emulated_rms_norm(x, w, 1e-5); },
                                           ref, tol.rtol, tol.atol);
}

INSTANTIATE_TEST_SUITE_P(Grid, RmsNormEmuTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 1000, 4096),
                                            ::testing::Values<int64_t>(1, 7)),
                         [](const auto& info) {
                           return testing::dtype_label(std::get<0>(info.param)) + "_h" +
                                  std::to_string(std::get<1>(info.param)) + "_r" +
                                  std::to_string(std::get<2>(info.param));
                         });

}  // namespace
}  // namespace strata::kernels
