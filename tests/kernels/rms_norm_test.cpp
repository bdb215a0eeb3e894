// launch_rms_norm against a plain libtorch RMSNorm over dtype x hidden size x row count.

#include <tuple>

#include "elementwise_reference.h"
#include "kernel_test_util.h"
#include "strata/kernels/torch_ops.h"

namespace strata::kernels {
namespace {

using testing::reference_rms_norm;
using testing::tolerance_for;

class RmsNormTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t>> {};

TEST_P(RmsNormTest, MatchesLibtorch) {
  STRATA_SKIP_WITHOUT_CUDA();
  const auto [dtype, hidden, rows] = GetParam();
  at::manual_seed(hidden * 131 + rows);
  const auto opts = at::TensorOptions().dtype(dtype).device(at::kCUDA);
  at::Tensor x = at::randn({rows, hidden}, opts) * 3;
  at::Tensor w = at::randn({hidden}, opts);
  at::Tensor ours = rms_norm(x, w, 1e-5);
  at::Tensor ref = reference_rms_norm(x, w, 1e-5);
  const auto tol = tolerance_for(dtype);
  EXPECT_TRUE(at::allclose(ours.to(at::kFloat), ref.to(at::kFloat), tol.rtol, tol.atol))
      << "max diff " << testing::max_abs_diff(ours, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, RmsNormTest,
    ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                       ::testing::Values<int64_t>(64, 576, 1000, 1536, 4096, 8192),
                       ::testing::Values<int64_t>(1, 7, 300)),
    [](const auto& info) {
      return testing::dtype_label(std::get<0>(info.param)) + "_h" +
             std::to_string(std::get<1>(info.param)) + "_r" +
             std::to_string(std::get<2>(info.param));
    });

TEST(RmsNormErrors, RejectsMismatchedInputs) {
  STRATA_SKIP_WITHOUT_CUDA();
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  EXPECT_THROW(rms_norm(at::randn({4, 64}, opts), at::randn({32}, opts), 1e-5), c10::Error);
  EXPECT_THROW(rms_norm(at::randn({4, 64}, opts), at::randn({64}, opts.dtype(at::kHalf)), 1e-5),
               c10::Error);
  EXPECT_THROW(rms_norm(at::randn({64, 4}, opts).t(), at::randn({64}, opts), 1e-5), c10::Error);
}

}  // namespace
}  // namespace strata::kernels
