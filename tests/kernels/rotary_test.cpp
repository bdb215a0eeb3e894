// launch_rotary against the libtorch expression x * cos + rotate_half(x) * sin over dtype x
// head_dim x heads x token count, with real RoPE tables (theta 10000 and 1e6, large positions).

#include <tuple>

#include "elementwise_reference.h"
#include "kernel_test_util.h"
#include "strata/kernels/torch_ops.h"

namespace strata::kernels {
namespace {

using testing::reference_rotary;
using testing::tolerance_for;

class RotaryTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t, int64_t>> {};

TEST_P(RotaryTest, MatchesLibtorch) {
  STRATA_SKIP_WITHOUT_CUDA();
  const auto [dtype, head_dim, num_heads, num_tokens] = GetParam();
  at::manual_seed(head_dim * 7 + num_heads * 13 + num_tokens);
  const auto [cos, sin] = testing::rope_tables(num_tokens, head_dim, dtype, at::kCUDA);
  at::Tensor x = at::randn({num_tokens, num_heads, head_dim},
                           at::TensorOptions().dtype(at::kFloat).device(at::kCUDA))
                     .to(dtype);

  at::Tensor ours = apply_rotary(x, cos, sin);
  at::Tensor ref = reference_rotary(x, cos, sin);
  const auto tol = tolerance_for(dtype);
  EXPECT_TRUE(at::allclose(ours.to(at::kFloat), ref.to(at::kFloat), tol.rtol, tol.atol))
      << "max diff " << testing::max_abs_diff(ours, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, RotaryTest,
    ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                       ::testing::Values<int64_t>(64, 128),
                       ::testing::Values<int64_t>(1, 3, 9, 32),
                       ::testing::Values<int64_t>(1, 17, 513)),
    [](const auto& info) {
      return testing::dtype_label(std::get<0>(info.param)) + "_d" +
             std::to_string(std::get<1>(info.param)) + "_h" +
             std::to_string(std::get<2>(info.param)) + "_t" +
             std::to_string(std::get<3>(info.param));
    });

TEST(RotaryErrors, RejectsMismatchedTables) {
  STRATA_SKIP_WITHOUT_CUDA();
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor x = at::randn({4, 2, 64}, opts);
  EXPECT_THROW(apply_rotary(x, at::randn({4, 32}, opts), at::randn({4, 32}, opts)), c10::Error);
  EXPECT_THROW(apply_rotary(x, at::randn({4, 64}, opts), at::randn({3, 64}, opts)), c10::Error);
  // Tables on another device than x.
  EXPECT_THROW(apply_rotary(x.to(at::kCPU), at::randn({4, 64}, opts), at::randn({4, 64}, opts)),
               c10::Error);
}

}  // namespace
}  // namespace strata::kernels
