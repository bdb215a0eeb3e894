// reshape_and_cache_kernel (16-byte and element copies) under the emulator against
// tests/kernels/reshape_and_cache_test.cpp's token-by-token reference and grid (dtypes x head_dim
// 64/100 x block size 16 x contiguous or fused-strided K/V, every 7th token skipped) under every
// schedule; head_dim 100 in 16-bit types takes the element-copy path.

#include <tuple>

#include "emulated_ops.h"
#include "emulated_test_util.h"
#include "kernel_tolerance.h"
#include "paged_attention_reference.h"

namespace strata::kernels {
namespace {

class ReshapeAndCacheEmuTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t, bool>> {};

TEST_P(ReshapeAndCacheEmuTest, MatchesReference) {
  const auto [dtype, head_dim, block_size, strided] = GetParam();
  const auto [kv_cache, key, value, slots] =
      testing::make_reshape_and_cache_case(dtype, head_dim, block_size, strided);
  const at::Tensor expected = testing::reference_reshape_and_cache(kv_cache, key, value, slots);
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor out = kv_cache.clone();
        testing::emulated_reshape_and_cache(out, key, value, slots);
        return out;
      },
      expected, 0.0, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Grid, ReshapeAndCacheEmuTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 100),
                                            ::testing::Values<int64_t>(16), ::testing::Bool()),
                         [](const auto& info) {
                           return testing::dtype_label(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + "_b" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_strided" : "_contiguous");
                         });

}  // namespace
}  // namespace strata::kernels
