// paged_attention on CUDA against the plain libtorch reference (paged_attention_reference.h)
// over dtype x head_dim x block_size x GQA ratio x batch kind (decode, verify, chunked prefill,
// prefill, mixed). Every batch uses a shuffled pool, NaN in every slot no sequence owns and
// poisoned table entries past each sequence, so reading past a context shows up as NaN or a
// fault. Extra cases cover long contexts (many split-K partitions), a large decode batch (no
// split) and a strided q view.

#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"
#include "paged_attention_reference.h"
#include "strata/kernels/torch_ops.h"

namespace strata::kernels {
namespace {

using testing::batch_shapes;
using testing::make_paged_batch;
using testing::PagedBatch;
using testing::reference_paged_attention;
using testing::SeqShape;

constexpr int64_t kNumKvHeads = 2;

// Runs the CUDA op on `q` (a CUDA tensor holding b.q's values) with b's pool and tables.
at::Tensor run_cuda(const PagedBatch& b, const at::Tensor& q) {
  const at::Device dev = q.device();
  return paged_attention(q, b.kv_cache.to(dev), b.block_tables.to(dev), b.seq_lens.to(dev),
                         b.cu_q_lens.to(dev), b.max_q_len, b.scale)
      .cpu();
}

void expect_matches_reference(const PagedBatch& b, const at::Tensor& ours) {
  const at::Tensor ref = reference_paged_attention(b);
  ASSERT_EQ(ours.sizes(), ref.sizes());
  EXPECT_EQ(ours.scalar_type(), b.q.scalar_type());
  EXPECT_FALSE(ours.isnan().any().item<bool>()) << "NaN in the output";
  const auto tol = testing::tolerance_for(b.q.scalar_type());
  EXPECT_TRUE(at::allclose(ours.to(at::kFloat), ref.to(at::kFloat), tol.rtol, tol.atol))
      << "max diff " << testing::max_abs_diff(ours, ref);
}

class PagedAttentionTest : public ::testing::TestWithParam<testing::PagedAttentionCase> {};

TEST_P(PagedAttentionTest, MatchesReference) {
  STRATA_SKIP_WITHOUT_CUDA();
  const auto [dtype, head_dim, block_size, group, kind] = GetParam();
  const PagedBatch b =
      make_paged_batch(batch_shapes(kind, block_size), kNumKvHeads * group, kNumKvHeads, head_dim,
                       block_size, dtype, head_dim * 1000 + block_size * 10 + group);
  expect_matches_reference(b, run_cuda(b, b.q.to(at::kCUDA)));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttentionTest,
    ::testing::Combine(::testing::Values(at::kBFloat16, at::kHalf),
                       ::testing::Values<int64_t>(64, 128), ::testing::Values<int64_t>(8, 16, 32),
                       ::testing::Values<int64_t>(1, 4, 8),
                       ::testing::Values<std::string>("decode", "verify", "chunked", "prefill",
                                                      "mixed")),
    [](const auto& info) { return testing::paged_attention_case_name(info.param); });

// Long contexts in small batches: many split-K partitions, including prefill tiles whose rows
// end in different partitions, and a GQA ratio (7) that does not divide the row tile.
TEST(PagedAttentionLong, SplitContexts) {
  STRATA_SKIP_WITHOUT_CUDA();
  const std::vector<std::vector<SeqShape>> batches = {
      {{1, 20000}}, {{40, 20000}}, {{1, 5000}, {3, 9000}, {1, 257}}};
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t group : {1, 4, 7}) {
      for (size_t i = 0; i < batches.size(); ++i) {
        SCOPED_TRACE(testing::dtype_label(dtype) + " group " + std::to_string(group) + " batch " +
                     std::to_string(i));
        const PagedBatch b = make_paged_batch(batches[i], 2 * group, 2, 128, 16, dtype, 7 + i);
        expect_matches_reference(b, run_cuda(b, b.q.to(at::kCUDA)));
      }
    }
  }
}

// Enough sequences that the launch does not split: every sequence is written directly.
TEST(PagedAttentionLong, LargeDecodeBatch) {
  STRATA_SKIP_WITHOUT_CUDA();
  at::manual_seed(3);
  const at::Tensor lens = at::randint(1, 600, {600}, at::TensorOptions().dtype(at::kLong));
  std::vector<SeqShape> shapes;
  for (int64_t i = 0; i < lens.size(0); ++i) shapes.push_back({1, lens[i].item<int64_t>()});
  const PagedBatch b = make_paged_batch(shapes, 16, 4, 128, 16, at::kBFloat16, 11);
  expect_matches_reference(b, run_cuda(b, b.q.to(at::kCUDA)));
}

// q as the query part of a fused [num_tokens, H + 2 Hkv, D] projection output (strided rows).
TEST(PagedAttentionLayout, StridedQueryView) {
  STRATA_SKIP_WITHOUT_CUDA();
  const PagedBatch b = make_paged_batch(batch_shapes("mixed", 16), 8, 2, 64, 16, at::kBFloat16, 5);
  at::Tensor fused = at::zeros({b.q.size(0), 8 + 2 * 2, 64},
                               at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
  fused.narrow(1, 0, 8).copy_(b.q);
  const at::Tensor q_view = fused.narrow(1, 0, 8);
  ASSERT_FALSE(q_view.is_contiguous());
  expect_matches_reference(b, run_cuda(b, q_view));
}

// The libtorch path on CUDA (KernelBackend::kTorch, what an op falls back to when the start-up
// self-check rejects the kernel) matches the reference too.
TEST(PagedAttentionFallback, LibtorchPathOnCuda) {
  STRATA_SKIP_WITHOUT_CUDA();
  const PagedBatch b = make_paged_batch(batch_shapes("mixed", 16), 8, 2, 64, 16, at::kBFloat16, 3);
  const at::Device dev(at::kCUDA);
  expect_matches_reference(
      b, paged_attention(b.q.to(dev), b.kv_cache.to(dev), b.block_tables.to(dev),
                         b.seq_lens.to(dev), b.cu_q_lens.to(dev), b.max_q_len, b.scale,
                         KernelBackend::kTorch)
             .cpu());
}

TEST(PagedAttentionErrors, RejectsUnsupportedInputs) {
  STRATA_SKIP_WITHOUT_CUDA();
  const PagedBatch b = make_paged_batch(batch_shapes("decode", 16), 8, 2, 64, 16, at::kHalf, 1);
  const at::Device dev(at::kCUDA);
  const at::Tensor kv = b.kv_cache.to(dev), bt = b.block_tables.to(dev);
  const at::Tensor lens = b.seq_lens.to(dev), cu = b.cu_q_lens.to(dev), q = b.q.to(dev);
  // Index tensors must live on q's device.
  EXPECT_THROW(paged_attention(q, kv, b.block_tables, lens, cu, 1, b.scale), c10::Error);
  EXPECT_THROW(paged_attention(q, kv, bt, b.seq_lens, cu, 1, b.scale), c10::Error);
  // head_dim 96 has no compiled variant.
  EXPECT_THROW(paged_attention(at::zeros({1, 8, 96}, q.options()),
                               at::zeros({4, 2, 2, 16, 96}, kv.options()), bt.narrow(0, 0, 1),
                               lens.narrow(0, 0, 1), cu.narrow(0, 0, 2), 1, b.scale),
               c10::Error);
  // The last dimension must be contiguous.
  EXPECT_THROW(
      paged_attention(q.transpose(1, 2).contiguous().transpose(1, 2), kv, bt, lens, cu, 1, b.scale),
      c10::Error);
}

}  // namespace
}  // namespace strata::kernels
