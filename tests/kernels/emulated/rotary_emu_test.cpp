// rotary_kernel under the emulator: tests/kernels/rotary_test.cpp's reference, RoPE tables and
// grid (dtypes x head_dim 64/128 x heads 1, 9 x tokens 1, 17) under every schedule.

#include <tuple>

#include "elementwise_reference.h"
#include "emulated_ops.h"
#include "emulated_test_util.h"
#include "kernel_tolerance.h"

namespace strata::kernels {
namespace {

class RotaryEmuTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t, int64_t>> {};

TEST_P(RotaryEmuTest, MatchesLibtorch) {
  const auto [dtype, head_dim, num_heads, num_tokens] = GetParam();
  at::manual_seed(head_dim * 7 + num_heads * 13 + num_tokens);
  const auto [cos, sin] = testing::rope_tables(num_tokens, head_dim, dtype, at::kCPU);
  const at::Tensor x = at::randn({num_tokens, num_heads, head_dim}).to(dtype);
  const at::Tensor ref = testing::reference_rotary(x, cos, sin);
  const auto tol = testing::tolerance_for(dtype);
  testing::expect_schedule_invariant_match([&] { return testing::emulated_rotary(x, cos, sin); },
                                           ref, tol.rtol, tol.atol);
}

INSTANTIATE_TEST_SUITE_P(Grid, RotaryEmuTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 128),
                                            ::testing::Values<int64_t>(1, 9),
                                            ::testing::Values<int64_t>(1, 17)),
                         [](const auto& info) {
                           return testing::dtype_label(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + "_h" +
                                  std::to_string(std::get<2>(info.param)) + "_t" +
                                  std::to_string(std::get<3>(info.param));
                         });

}  // namespace
}  // namespace strata::kernels
