// Strata's CPU kernels (kernels/cpu_ops.h) against the plain libtorch references shared with the
// GPU and emulator tests, over dtypes, sizes and strided inputs; and through the adapters, which
// take them for CPU tensors under KernelBackend::kStrata.

#include "strata/kernels/cpu_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "elementwise_reference.h"
#include "kernel_tolerance.h"
#include "strata/kernels/aten_ops.h"
#include "strata/kernels/torch_ops.h"

namespace strata::kernels {
namespace {

using testing::max_abs_diff;
using testing::tolerance_for;

void expect_close(const at::Tensor& ours, const at::Tensor& ref, at::ScalarType dtype) {
  ASSERT_EQ(ours.sizes(), ref.sizes());
  ASSERT_EQ(ours.scalar_type(), ref.scalar_type());
  const auto tol = tolerance_for(dtype);
  EXPECT_TRUE(at::allclose(ours.to(at::kFloat), ref.to(at::kFloat), tol.rtol, tol.atol))
      << "max diff " << max_abs_diff(ours, ref);
}

// (dtype, hidden size or head_dim, rows or tokens)
using Shape = std::tuple<at::ScalarType, int64_t, int64_t>;
std::string shape_label(const ::testing::TestParamInfo<Shape>& info) {
  return testing::dtype_label(std::get<0>(info.param)) + "_d" +
         std::to_string(std::get<1>(info.param)) + "_n" + std::to_string(std::get<2>(info.param));
}

class CpuRmsNormTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CpuRmsNormTest, MatchesLibtorch) {
  const auto [dtype, hidden, rows] = GetParam();
  at::manual_seed(hidden * 131 + rows);
  const auto opts = at::TensorOptions().dtype(dtype);
  // Rows of a wider tensor: a strided outer dimension.
  const at::Tensor x = (at::randn({rows, hidden + 8}, opts) * 3).narrow(1, 0, hidden);
  const at::Tensor w = at::randn({hidden}, opts);
  expect_close(cpu::rms_norm(x, w, 1e-5), testing::reference_rms_norm(x, w, 1e-5), dtype);
}

INSTANTIATE_TEST_SUITE_P(Grid, CpuRmsNormTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 576, 1536, 4096),
                                            ::testing::Values<int64_t>(1, 7, 300)),
                         shape_label);

class CpuRotaryTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CpuRotaryTest, MatchesLibtorch) {
  const auto [dtype, head_dim, tokens] = GetParam();
  at::manual_seed(head_dim * 7 + tokens);
  const auto opts = at::TensorOptions().dtype(dtype);
  const at::Tensor x = at::randn({tokens, 5, head_dim}, opts);
  const testing::RopeTables rope = testing::rope_tables(tokens, head_dim, dtype, at::kCPU);
  const at::Tensor ours = cpu::apply_rotary(x, rope.cos, rope.sin);
  const at::Tensor ref = testing::reference_rotary(x, rope.cos, rope.sin);
  expect_close(ours, ref, dtype);
  // In float32 every rounding is ATen's: equal.
  if (dtype == at::kFloat) {
    EXPECT_TRUE(at::equal(ours, ref)) << max_abs_diff(ours, ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, CpuRotaryTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 80, 128),
                                            ::testing::Values<int64_t>(1, 7, 300)),
                         shape_label);

// A row's result does not depend on the rows beside it (batch invariance).
TEST(CpuRmsNormBatchTest, RowsDoNotDependOnTheirNeighbours) {
  const at::Tensor x = at::randn({103, 576}) * 3;
  const at::Tensor w = at::randn({576});
  const at::Tensor all = cpu::rms_norm(x, w, 1e-5);
  for (int64_t begin : {0, 1, 50}) {
    for (int64_t n : {1, 3, 50}) {
      EXPECT_TRUE(at::equal(cpu::rms_norm(x.narrow(0, begin, n), w, 1e-5), all.narrow(0, begin, n)))
          << begin << " " << n;
    }
  }
}

// The KV-cache write equals libtorch's bit for bit, skips slot -1, and refuses a slot outside
// the pool before writing anything.
TEST(CpuReshapeAndCacheTest, MatchesLibtorchExactly) {
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto opts = at::TensorOptions().dtype(dtype);
    const int64_t blocks = 6, heads = 3, block_size = 16, dim = 64, tokens = 40;
    const at::Tensor start = at::randn({blocks, 2, heads, block_size, dim}, opts);
    const at::Tensor key = at::randn({tokens, heads, dim}, opts);
    const at::Tensor value = at::randn({tokens, heads, dim}, opts);
    at::Tensor slots = at::randperm(blocks * block_size, at::kLong).narrow(0, 0, tokens).clone();
    slots.index_put_({at::arange(0, tokens, 5)}, -1);
    at::Tensor ours = start.clone(), ref = start.clone();
    cpu::reshape_and_cache(ours, key, value, slots);
    aten::reshape_and_cache(ref, key, value, slots);
    EXPECT_TRUE(at::equal(ours, ref));
    EXPECT_FALSE(at::equal(ours, start));

    at::Tensor bad = slots.clone();
    bad[tokens - 1] = blocks * block_size;
    at::Tensor untouched = start.clone();
    EXPECT_THROW(cpu::reshape_and_cache(untouched, key, value, bad), c10::Error);
    EXPECT_TRUE(at::equal(untouched, start));
  }
}

// The adapters take the CPU kernels for kStrata and libtorch for kTorch; inputs whose innermost
// dimension is strided go to libtorch either way.
TEST(CpuKernelDispatchTest, AdaptersAgreeOnBothBackends) {
  const at::Tensor x = at::randn({9, 576});
  const at::Tensor w = at::randn({576});
  EXPECT_TRUE(at::allclose(rms_norm(x, w, 1e-5, KernelBackend::kStrata),
                           rms_norm(x, w, 1e-5, KernelBackend::kTorch), 1e-5, 1e-5));
  const at::Tensor strided = at::randn({576, 9}).t();
  EXPECT_TRUE(at::allclose(rms_norm(strided, w, 1e-5, KernelBackend::kStrata),
                           testing::reference_rms_norm(strided, w, 1e-5), 1e-5, 1e-5));
}

}  // namespace
}  // namespace strata::kernels
