// LeanKV's quantize-on-append kernel (kernels/leankv/write_tokens.cu) under the emulator against
// the libtorch reference (kernels::aten::leankv_write_tokens), every schedule: the pool's bytes
// bit-identical after writing tokens in scattered slots of several pages. Grid: float32 / fp16 /
// bf16 input x head_dim 64 / 128 x high / low precision x K8V4 / K4V2 and K8V8 / K2V2 pages
// (every bit width, 2-bit codes shared by two lanes at head_dim 64 included), rows with a
// constant (scale 0) and rows with large values.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "emulated_test_util.h"
#include "kernel_tolerance.h"
#include "launch_params.h"
#include "strata/kernels/leankv_ops.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using kv::leankv::PageFormat;
using kv::leankv::Precision;
using kv::leankv::PrecisionBits;

using Params = std::tuple<at::ScalarType, int64_t, Precision, bool>;

class LeanKvWriteEmuTest : public ::testing::TestWithParam<Params> {};

TEST_P(LeanKvWriteEmuTest, BitIdenticalToReference) {
  const auto [dtype, head_dim, precision, wide_formats] = GetParam();
  const PageFormat f =
      wide_formats
          ? PageFormat::create(head_dim, PrecisionBits{8, 8}, PrecisionBits{2, 2}, 16).value()
          : PageFormat::create(head_dim, PrecisionBits{8, 4}, PrecisionBits{4, 2}, 16).value();
  at::manual_seed(head_dim + static_cast<int>(precision) + 10 * wide_formats);
  constexpr int64_t kTokens = 23;
  const int64_t per_page = f.tokens_per_page(precision);
  // Distinct (page, slot) pairs over 4 pages, in scrambled order.
  const at::Tensor cells = at::randperm(4 * per_page, at::kLong).slice(0, 0, kTokens);
  const at::Tensor page = cells.div(per_page, "floor"), slot = cells.remainder(per_page);
  at::Tensor key = (at::randn({kTokens, head_dim}) * 3).to(dtype);
  at::Tensor value = at::randn({kTokens, head_dim}).to(dtype);
  value[3].fill_(1.5);
  key[5].mul_(500);
  const at::Tensor acc = at::rand({kTokens});
  const at::Tensor position = at::randint(0, 1 << 20, {kTokens}, at::kInt);
  const at::Tensor start = at::randint(0, 256, {4, f.page_bytes()}, at::kByte);
  at::Tensor expected = start.clone();
  aten::leankv_write_tokens(expected, f, precision, page, slot, key, value, acc, position);
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor pool = start.clone();
        launch_leankv_write_tokens(
            leankv_write_params(pool, f, precision, page, slot, key, value, acc, position),
            nullptr);
        return pool;
      },
      expected, 0.0, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Grid, LeanKvWriteEmuTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 128),
                                            ::testing::Values(Precision::kHigh, Precision::kLow),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return testing::dtype_label(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) == Precision::kHigh ? "_high" : "_low") +
                                  (std::get<3>(info.param) ? "_k8v8_k2v2" : "_k8v4_k4v2");
                         });

}  // namespace
}  // namespace strata::kernels
