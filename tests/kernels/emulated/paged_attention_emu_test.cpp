// paged_attention_kernel and paged_attention_reduce_kernel under the emulator, against
// tests/kernels/paged_attention_test.cpp's reference and batches (paged_attention_reference.h:
// shuffled pools, NaN in every slot no sequence owns, poisoned table entries) under every
// schedule. The grid is the GPU test's, trimmed: both dtypes and head dims, block sizes 8 and 32,
// GQA 1 and 4, every batch kind. The emulated device is an A100 (108 SMs), so small batches split
// their contexts (reduce kernel) while others are written directly; one case forces no split.

#include <string>
#include <tuple>
#include <vector>

#include "emulated_ops.h"
#include "emulated_test_util.h"
#include "kernel_tolerance.h"
#include "paged_attention_reference.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using testing::batch_shapes;
using testing::make_paged_batch;
using testing::PagedBatch;
using testing::SeqShape;

void expect_matches_reference(const PagedBatch& b, const at::Tensor& q) {
  const at::Tensor ref = testing::reference_paged_attention(b);
  const auto tol = testing::tolerance_for(b.q.scalar_type());
  testing::expect_schedule_invariant_match(
      [&] {
        return testing::emulated_paged_attention(q, b.kv_cache, b.block_tables, b.seq_lens,
                                                 b.cu_q_lens, b.max_q_len, b.scale);
      },
      ref, tol.rtol, tol.atol);
}

class PagedAttentionEmuTest : public ::testing::TestWithParam<testing::PagedAttentionCase> {};

TEST_P(PagedAttentionEmuTest, MatchesReference) {
  const auto [dtype, head_dim, block_size, group, kind] = GetParam();
  constexpr int64_t kNumKvHeads = 2;
  const PagedBatch b =
      make_paged_batch(batch_shapes(kind, block_size), kNumKvHeads * group, kNumKvHeads, head_dim,
                       block_size, dtype, head_dim * 1000 + block_size * 10 + group);
  expect_matches_reference(b, b.q);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttentionEmuTest,
    ::testing::Combine(::testing::Values(at::kBFloat16, at::kHalf),
                       ::testing::Values<int64_t>(64, 128), ::testing::Values<int64_t>(8, 32),
                       ::testing::Values<int64_t>(1, 4),
                       ::testing::Values<std::string>("decode", "verify", "chunked", "prefill",
                                                      "mixed")),
    [](const auto& info) { return testing::paged_attention_case_name(info.param); });

// A GQA ratio (7) that does not divide the row tile, prefill rows ending in different split-K
// partitions.
TEST(PagedAttentionEmuLong, SplitContexts) {
  const std::vector<SeqShape> batch = {{1, 3000}, {3, 2500}, {1, 257}};
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(testing::dtype_label(dtype));
    const PagedBatch b = make_paged_batch(batch, 14, 2, 128, 16, dtype, 7);
    expect_matches_reference(b, b.q);
  }
}

// One SM: the grid fills a wave without splitting, so every sequence is written directly.
TEST(PagedAttentionEmuLong, NoSplitOnASmallDevice) {
  cuemu::DeviceModel one_sm = cuemu::a100();
  one_sm.sm_count = 1;
  const cuemu::DeviceModel previous = cuemu::set_device(one_sm);
  const PagedBatch b = make_paged_batch(batch_shapes("mixed", 16), 8, 2, 64, 16, at::kBFloat16, 13);
  expect_matches_reference(b, b.q);
  cuemu::set_device(previous);
}

// q as the query part of a fused [num_tokens, H + 2 Hkv, D] projection output (strided rows).
TEST(PagedAttentionEmuLayout, StridedQueryView) {
  const PagedBatch b = make_paged_batch(batch_shapes("mixed", 16), 8, 2, 64, 16, at::kBFloat16, 5);
  at::Tensor fused =
      at::zeros({b.q.size(0), 8 + 2 * 2, 64}, at::TensorOptions().dtype(at::kBFloat16));
  fused.narrow(1, 0, 8).copy_(b.q);
  const at::Tensor q_view = fused.narrow(1, 0, 8);
  ASSERT_FALSE(q_view.is_contiguous());
  expect_matches_reference(b, q_view);
}

}  // namespace
}  // namespace strata::kernels
