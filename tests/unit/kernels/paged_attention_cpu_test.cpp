// The CPU paths of paged_attention and reshape_and_cache (kernels/torch_ops), which are the CPU
// serving path, against the plain references of tests/kernels/paged_attention_reference.h over
// the same grid as the GPU test (float32 and bfloat16 here, plus float16 spot checks), and the
// errors that bad shapes, dtypes and index values raise.

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

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

// SDPA and the reference sum in different orders; the bf16/fp16 CPU SDPA kernels also round
// the probabilities to the input dtype before the value product.
struct Tolerance {
  double atol;
  double rtol;
};
Tolerance tolerance_for(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return {2e-5, 2e-5};
    case at::kHalf: return {4e-3, 4e-3};
    default: return {2e-2, 2e-2};
  }
}

at::Tensor run(const PagedBatch& b) {
  return paged_attention(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, b.max_q_len,
                         b.scale);
}

void expect_matches_reference(const PagedBatch& b, const at::Tensor& ours) {
  const at::Tensor ref = reference_paged_attention(b);
  ASSERT_EQ(ours.sizes(), ref.sizes());
  EXPECT_EQ(ours.scalar_type(), b.q.scalar_type());
  EXPECT_FALSE(ours.isnan().any().item<bool>()) << "NaN in the output";
  const Tolerance tol = tolerance_for(b.q.scalar_type());
  const double max_diff = (ours.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(ours.to(at::kFloat), ref.to(at::kFloat), tol.rtol, tol.atol))
      << "max diff " << max_diff;
}

std::string dtype_label(at::ScalarType dtype) { return std::string(c10::toString(dtype)); }

class PagedAttentionCpuTest
    : public ::testing::TestWithParam<
          std::tuple<at::ScalarType, int64_t, int64_t, int64_t, std::string>> {};

TEST_P(PagedAttentionCpuTest, MatchesReference) {
  const auto [dtype, head_dim, block_size, group, kind] = GetParam();
  const PagedBatch b =
      make_paged_batch(batch_shapes(kind, block_size), kNumKvHeads * group, kNumKvHeads,
                       head_dim, block_size, dtype, head_dim * 1000 + block_size * 10 + group);
  expect_matches_reference(b, run(b));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttentionCpuTest,
    ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                       ::testing::Values<int64_t>(64, 128),
                       ::testing::Values<int64_t>(8, 16, 32),
                       ::testing::Values<int64_t>(1, 4, 8),
                       ::testing::Values<std::string>("decode", "verify", "chunked", "prefill",
                                                      "mixed")),
    [](const auto& info) {
      return dtype_label(std::get<0>(info.param)) + "_d" +
             std::to_string(std::get<1>(info.param)) + "_b" +
             std::to_string(std::get<2>(info.param)) + "_g" +
             std::to_string(std::get<3>(info.param)) + "_" + std::get<4>(info.param);
    });

TEST(PagedAttentionCpu, Float16AndOddShapes) {
  // float16, a GQA ratio that does not divide the heads evenly into 8, head_dim 80 (CPU only).
  for (const auto& [dtype, group, head_dim] :
       {std::tuple{at::kHalf, int64_t{4}, int64_t{128}},
        std::tuple{at::kFloat, int64_t{7}, int64_t{64}},
        std::tuple{at::kFloat, int64_t{3}, int64_t{80}}}) {
    SCOPED_TRACE(dtype_label(dtype) + " group " + std::to_string(group));
    const PagedBatch b =
        make_paged_batch(batch_shapes("mixed", 16), 2 * group, 2, head_dim, 16, dtype, 9);
    expect_matches_reference(b, run(b));
  }
}

TEST(PagedAttentionCpu, StridedQueryView) {
  const PagedBatch b = make_paged_batch(batch_shapes("chunked", 8), 8, 2, 64, 8, at::kFloat, 4);
  at::Tensor fused = at::zeros({b.q.size(0), 12, 64});
  fused.narrow(1, 0, 8).copy_(b.q);
  const at::Tensor out = paged_attention(fused.narrow(1, 0, 8), b.kv_cache, b.block_tables,
                                         b.seq_lens, b.cu_q_lens, b.max_q_len, b.scale);
  expect_matches_reference(b, out);
}

TEST(PagedAttentionCpu, EmptyBatch) {
  const PagedBatch b = make_paged_batch({{0, 3}}, 4, 2, 64, 8, at::kFloat, 2);
  const at::Tensor out = run(b);
  EXPECT_EQ(out.size(0), 0);
  EXPECT_EQ(out.size(1), 4);
}

// Krul's decode rows (paged_attention's probs): each query's softmax over its sequence's keys,
// against plain libtorch over the keys gathered by the block table; the attention itself
// unchanged. Only the CPU decode kernel writes them.
TEST(PagedAttentionCpu, DecodeProbabilitiesAreEachQuerysAttentionRow) {
  for (const auto& [dtype, group, block_size] :
       {std::tuple{at::kFloat, int64_t{1}, int64_t{16}},
        std::tuple{at::kFloat, int64_t{4}, int64_t{8}},
        std::tuple{at::kBFloat16, int64_t{3}, int64_t{32}}}) {
    SCOPED_TRACE(dtype_label(dtype) + " group " + std::to_string(group));
    std::vector<SeqShape> shapes = batch_shapes("decode", block_size);
    shapes.insert(shapes.begin() + 2, SeqShape{0, 9});  // no query this step
    const PagedBatch b =
        make_paged_batch(shapes, kNumKvHeads * group, kNumKvHeads, 64, block_size, dtype, 17);
    at::Tensor probs;
    const at::Tensor out = paged_attention(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens,
                                           b.max_q_len, b.scale, KernelBackend::kStrata, &probs);
    expect_matches_reference(b, out);
    ASSERT_TRUE(probs.defined());
    const int64_t num_heads = b.q.size(1);
    ASSERT_EQ(probs.sizes(), (std::vector<int64_t>{std::ssize(shapes), num_heads,
                                                   b.seq_lens.max().item<int64_t>()}));
    for (size_t s = 0; s < shapes.size(); ++s) {
      if (shapes[s].q_len == 0) continue;
      const int64_t len = shapes[s].seq_len, token = b.cu_q_lens[s].item<int64_t>();
      std::vector<at::Tensor> keys;  // [len, Hkv, D]
      for (int64_t t = 0; t < len; ++t) {
        const int64_t block = b.block_tables[s][t / block_size].item<int64_t>();
        keys.push_back(b.kv_cache[block][0].select(1, t % block_size));
      }
      const at::Tensor k = at::stack(keys).to(at::kFloat).repeat_interleave(group, 1);
      const at::Tensor q = b.q[token].to(at::kFloat);  // [H, D]
      const at::Tensor expected = at::softmax(at::einsum("hd,thd->ht", {q, k}) * b.scale, -1);
      const at::Tensor got = probs[s].narrow(1, 0, len);
      EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-6))
          << "sequence " << s << ": max diff " << (got - expected).abs().max().item<double>();
    }
    at::Tensor none;
    (void)paged_attention(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, b.max_q_len,
                          b.scale, KernelBackend::kTorch, &none);
    EXPECT_FALSE(none.defined()) << "libtorch's path writes no probabilities";
  }
  const PagedBatch prefill =
      make_paged_batch(batch_shapes("chunked", 16), 4, 2, 64, 16, at::kFloat, 3);
  at::Tensor probs = at::zeros({1});
  (void)paged_attention(prefill.q, prefill.kv_cache, prefill.block_tables, prefill.seq_lens,
                        prefill.cu_q_lens, prefill.max_q_len, prefill.scale, KernelBackend::kStrata,
                        &probs);
  EXPECT_FALSE(probs.defined()) << "a batch with several queries per sequence has no decode rows";
}

// ---- reshape_and_cache --------------------------------------------------------------------------

TEST(ReshapeAndCacheCpu, MatchesReference) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t block_size : {8, 16, 32}) {
      SCOPED_TRACE(dtype_label(dtype) + " block_size " + std::to_string(block_size));
      at::manual_seed(block_size);
      const auto opts = at::TensorOptions().dtype(dtype);
      const int64_t num_blocks = 12, num_tokens = 40;
      at::Tensor kv = at::randn({num_blocks, 2, 4, block_size, 64}, opts);
      at::Tensor slots = at::randperm(num_blocks * block_size, at::TensorOptions().dtype(at::kLong))
                             .narrow(0, 0, num_tokens)
                             .clone();
      slots.index_fill_(0, at::arange(0, num_tokens, 5, at::TensorOptions().dtype(at::kLong)),
                        -1);
      at::Tensor fused = at::randn({num_tokens, 16, 64}, opts);  // K, V as strided views
      const at::Tensor key = fused.narrow(1, 8, 4), value = fused.narrow(1, 12, 4);
      const at::Tensor expected = testing::reference_reshape_and_cache(kv, key, value, slots);
      reshape_and_cache(kv, key, value, slots);
      EXPECT_TRUE(at::equal(kv, expected));
    }
  }
}

// Writing a batch's K/V token by token, then attending, equals attending the batch directly.
TEST(ReshapeAndCacheCpu, WriteThenAttend) {
  const PagedBatch b = make_paged_batch(batch_shapes("mixed", 16), 8, 2, 64, 16, at::kFloat, 8);
  std::vector<at::Tensor> keys, values, slot_parts;
  for (int64_t s = 0; s < b.seq_lens.size(0); ++s) {
    keys.push_back(testing::gather_sequence(b, s, 0));
    values.push_back(testing::gather_sequence(b, s, 1));
    const at::Tensor pos =
        at::arange(b.seq_lens[s].item<int64_t>(), at::TensorOptions().dtype(at::kLong));
    const at::Tensor blocks = b.block_tables[s].to(at::kLong).index_select(0, pos.div(16, "floor"));
    slot_parts.push_back(blocks * 16 + pos.remainder(16));
  }
  at::Tensor pool = at::full_like(b.kv_cache, NAN);
  reshape_and_cache(pool, at::cat(keys), at::cat(values), at::cat(slot_parts));
  const at::Tensor out = paged_attention(b.q, pool, b.block_tables, b.seq_lens, b.cu_q_lens,
                                         b.max_q_len, b.scale);
  expect_matches_reference(b, out);
}

// ---- errors -------------------------------------------------------------------------------------

// `fn` throws c10::Error whose message contains `needle`.
void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what_without_backtrace() << "\" lacks \"" << needle << "\"";
  }
}

class PagedAttentionCpuErrors : public ::testing::Test {
 protected:
  PagedBatch b = make_paged_batch({{1, 20}, {3, 9}}, 8, 2, 64, 8, at::kFloat, 1);
  at::Tensor call(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt,
                  const at::Tensor& lens, const at::Tensor& cu, int64_t max_q_len) {
    return paged_attention(q, kv, bt, lens, cu, max_q_len, b.scale);
  }
};

TEST_F(PagedAttentionCpuErrors, Shapes) {
  expect_error([&] {
    call(b.q.flatten(1), b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, 3);
  }, "q must be [num_tokens, num_heads, head_dim]");
  expect_error([&] { call(b.q, b.kv_cache[0], b.block_tables, b.seq_lens, b.cu_q_lens, 3); },
               "kv_cache must be [num_blocks, 2, num_kv_heads, block_size, head_dim]");
  expect_error([&] {
    call(b.q.narrow(2, 0, 32), b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, 3);
  }, "does not match q head_dim");
  expect_error([&] {
    call(b.q.narrow(1, 0, 7), b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, 3);
  }, "must be a multiple of num_kv_heads");
  expect_error([&] {
    call(b.q, b.kv_cache.narrow(3, 0, 6), b.block_tables, b.seq_lens, b.cu_q_lens, 3);
  }, "block_size (kv_cache dim 3) must be a power of two");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables.narrow(0, 0, 1), b.seq_lens, b.cu_q_lens, 3);
  }, "block_tables must be [num_seqs = 2");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens.narrow(0, 0, 2), 3);
  }, "cu_q_lens must be [num_seqs + 1 = 3]");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, b.seq_lens.unsqueeze(0), b.cu_q_lens, 3);
  }, "seq_lens must be [num_seqs]");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables.narrow(0, 0, 0), b.seq_lens.narrow(0, 0, 0),
         b.cu_q_lens.narrow(0, 0, 1), 3);
  }, "q has 4 tokens but there are no sequences");
  expect_error([&] { call(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, 0); },
               "max_q_len must be >= 1");
}

TEST_F(PagedAttentionCpuErrors, DtypesAndDevices) {
  expect_error([&] {
    call(b.q.to(at::kBFloat16), b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, 3);
  }, "expected q's dtype");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables.to(at::kLong), b.seq_lens, b.cu_q_lens, 3);
  }, "block_tables must be int32");
  expect_error([&] {
    call(b.q.to(at::kDouble), b.kv_cache.to(at::kDouble), b.block_tables, b.seq_lens,
         b.cu_q_lens, 3);
  }, "supports float32, float16 and bfloat16");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens.to(at::kLong), 3);
  }, "cu_q_lens must be int32");
}

TEST_F(PagedAttentionCpuErrors, IndexValues) {
  auto with = [](const at::Tensor& t, int64_t i, int32_t v) {
    at::Tensor c = t.clone();
    c.view({-1})[i].fill_(v);
    return c;
  };
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens, 2);
  }, "has q_len 3 > max_q_len 2");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, with(b.seq_lens, 1, 2), b.cu_q_lens, 3);
  }, "has seq_len 2 < q_len 3");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, b.seq_lens, with(b.cu_q_lens, 2, 3), 3);
  }, "cu_q_lens must run from 0 to num_tokens 4");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, with(b.seq_lens, 0, 100), b.cu_q_lens, 3);
  }, "blocks but block_tables has");
  expect_error([&] {
    call(b.q, b.kv_cache, with(b.block_tables, 0, 999), b.seq_lens, b.cu_q_lens, 3);
  }, "is not a block of the pool");
  expect_error([&] {
    call(b.q, b.kv_cache, b.block_tables, b.seq_lens, with(b.cu_q_lens, 1, 5), 10);
  }, "cu_q_lens must be non-decreasing (sequence 1)");
}

TEST(ReshapeAndCacheCpuErrors, RejectsBadInputs) {
  at::Tensor kv = at::zeros({4, 2, 2, 8, 64});
  const at::Tensor key = at::zeros({3, 2, 64});
  const at::Tensor slots = at::tensor({0L, 5L, -1L});
  expect_error([&] { reshape_and_cache(kv, key, key, slots.to(at::kInt)); },
               "slot_mapping must be int64");
  expect_error([&] { reshape_and_cache(kv, at::zeros({3, 4, 64}), key, slots); },
               "key must be [num_tokens, num_kv_heads = 2, head_dim = 64]");
  expect_error([&] { reshape_and_cache(kv, key, at::zeros({3, 2, 32}), slots); },
               "value must match key");
  expect_error([&] { reshape_and_cache(kv, key.to(at::kHalf), key.to(at::kHalf), slots); },
               "expected kv_cache's dtype");
  expect_error([&] { reshape_and_cache(kv, key, key, at::tensor({0L, 32L, 1L})); },
               "slot 32 is outside the pool of 4 blocks x 8 slots");
  expect_error([&] { reshape_and_cache(kv, key, key, at::tensor({0L, 1L})); },
               "slot_mapping must be [num_tokens = 3]");
}

}  // namespace
}  // namespace strata::kernels
