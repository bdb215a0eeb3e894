// reshape_and_cache on CUDA against a token-by-token libtorch reference over dtype x head_dim x
// block_size x key layout (contiguous, or a strided view of a fused QKV output), with skipped
// (slot -1) tokens; head_dim 100 in 16-bit types takes the element-copy path. Then a write of a
// whole batch's K/V followed by paged_attention, which must match attention over contiguous K/V.

#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"
#include "paged_attention_reference.h"
#include "strata/kernels/torch_ops.h"

namespace strata::kernels {
namespace {

using testing::kReshapeKvHeads;
using testing::kReshapeTokens;

class ReshapeAndCacheTest
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t, bool>> {};

TEST_P(ReshapeAndCacheTest, MatchesReference) {
  STRATA_SKIP_WITHOUT_CUDA();
  const auto [dtype, head_dim, block_size, strided] = GetParam();
  const auto [kv_cache, key, value, slots] =
      testing::make_reshape_and_cache_case(dtype, head_dim, block_size, strided);
  const auto opts = at::TensorOptions().dtype(dtype);
  const at::Tensor expected = testing::reference_reshape_and_cache(kv_cache, key, value, slots);

  at::Tensor kv_gpu = kv_cache.to(at::kCUDA);
  reshape_and_cache(kv_gpu, key.to(at::kCUDA), value.to(at::kCUDA), slots.to(at::kCUDA));
  EXPECT_TRUE(at::equal(kv_gpu.cpu(), expected));

  if (strided) {  // the same write from views that keep the fused strides on the device
    at::Tensor fused =
        at::zeros({kReshapeTokens, 4 * kReshapeKvHeads, head_dim}, opts.device(at::kCUDA));
    fused.narrow(1, 2 * kReshapeKvHeads, kReshapeKvHeads).copy_(key);
    fused.narrow(1, 3 * kReshapeKvHeads, kReshapeKvHeads).copy_(value);
    at::Tensor kv2 = kv_cache.to(at::kCUDA);
    reshape_and_cache(kv2, fused.narrow(1, 2 * kReshapeKvHeads, kReshapeKvHeads),
                      fused.narrow(1, 3 * kReshapeKvHeads, kReshapeKvHeads), slots.to(at::kCUDA));
    EXPECT_TRUE(at::equal(kv2.cpu(), expected));
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, ReshapeAndCacheTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 100, 128),
                                            ::testing::Values<int64_t>(8, 16, 32),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return testing::dtype_label(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + "_b" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_strided" : "_contiguous");
                         });

// Write every token of a batch through reshape_and_cache into an empty (NaN) pool, then
// paged_attention over it must match the reference on the batch built directly.
TEST(ReshapeAndCacheRoundTrip, WriteThenAttend) {
  STRATA_SKIP_WITHOUT_CUDA();
  for (int64_t block_size : {8, 16, 32}) {
    SCOPED_TRACE("block_size " + std::to_string(block_size));
    const testing::PagedBatch b = testing::make_paged_batch(
        testing::batch_shapes("mixed", block_size), 8, 2, 128, block_size, at::kBFloat16, 21);
    // Token-major K/V of the whole pool content of every sequence, and its slots.
    std::vector<at::Tensor> keys, values, slot_parts;
    for (int64_t s = 0; s < b.seq_lens.size(0); ++s) {
      keys.push_back(testing::gather_sequence(b, s, 0).to(at::kBFloat16));
      values.push_back(testing::gather_sequence(b, s, 1).to(at::kBFloat16));
      const int64_t ctx = b.seq_lens[s].item<int64_t>();
      const at::Tensor pos = at::arange(ctx, at::TensorOptions().dtype(at::kLong));
      const at::Tensor blocks =
          b.block_tables[s].to(at::kLong).index_select(0, pos.div(block_size, "floor"));
      slot_parts.push_back(blocks * block_size + pos.remainder(block_size));
    }
    const at::Device dev(at::kCUDA);
    at::Tensor pool = at::full_like(b.kv_cache, NAN).to(dev);
    reshape_and_cache(pool, at::cat(keys).to(dev), at::cat(values).to(dev),
                      at::cat(slot_parts).to(dev));
    const at::Tensor ours =
        paged_attention(b.q.to(dev), pool, b.block_tables.to(dev), b.seq_lens.to(dev),
                        b.cu_q_lens.to(dev), b.max_q_len, b.scale)
            .cpu();
    const at::Tensor ref = testing::reference_paged_attention(b);
    const auto tol = testing::tolerance_for(at::kBFloat16);
    EXPECT_TRUE(at::allclose(ours.to(at::kFloat), ref.to(at::kFloat), tol.rtol, tol.atol))
        << "max diff " << testing::max_abs_diff(ours, ref);
  }
}

TEST(ReshapeAndCacheErrors, RejectsMismatchedInputs) {
  STRATA_SKIP_WITHOUT_CUDA();
  const auto opts = at::TensorOptions().dtype(at::kHalf).device(at::kCUDA);
  at::Tensor kv = at::zeros({4, 2, 2, 16, 64}, opts);
  const at::Tensor key = at::zeros({3, 2, 64}, opts);
  const at::Tensor slots = at::zeros({3}, opts.dtype(at::kLong));
  EXPECT_THROW(reshape_and_cache(kv, key, key, slots.to(at::kInt)), c10::Error);
  EXPECT_THROW(reshape_and_cache(kv, key.to(at::kFloat), key, slots), c10::Error);
  EXPECT_THROW(reshape_and_cache(kv, at::zeros({3, 4, 64}, opts), key, slots), c10::Error);
  EXPECT_THROW(reshape_and_cache(kv, key, key, slots.cpu()), c10::Error);
}

}  // namespace
}  // namespace strata::kernels
