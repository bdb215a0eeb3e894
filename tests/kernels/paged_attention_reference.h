// Plain libtorch references for paged attention and the KV-cache write, and the batch builder
// shared by the GPU kernel tests (tests/kernels, label gpu) and the CPU adapter tests
// (tests/unit/kernels). The attention reference gathers each sequence's K/V token by token and
// runs an explicit float32 softmax(q k^T * scale + causal mask) v: no SDPA and no block-wise
// index_select, so it checks the implementations rather than repeating them. CPU tensors only.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace strata::kernels::testing {

// One sequence of a batch: `q_len` new tokens at the end of a context of `seq_len` tokens.
struct SeqShape {
  int64_t q_len;
  int64_t seq_len;
};

struct PagedBatch {
  at::Tensor q;             // [num_tokens, num_heads, head_dim]
  at::Tensor kv_cache;      // [num_blocks, 2, num_kv_heads, block_size, head_dim]
  at::Tensor block_tables;  // [num_seqs, max_blocks_per_seq] int32
  at::Tensor seq_lens;      // [num_seqs] int32
  at::Tensor cu_q_lens;     // [num_seqs + 1] int32
  int64_t max_q_len = 1;
  double scale = 1.0;
  int64_t block_size = 0;
};

// An id no pool has: a kernel that reads a table entry past a sequence's length faults.
constexpr int32_t kPoisonBlockId = 1 << 30;

// Builds a batch on the CPU. Blocks come from a shuffled pool (with spare blocks), so each
// sequence's blocks are neither contiguous nor ordered; every pool slot that holds no token of a
// sequence is NaN (a kernel that lets one into a sum produces NaN); table entries past each
// sequence's length (and `extra_columns` spare columns) hold kPoisonBlockId.
inline PagedBatch make_paged_batch(const std::vector<SeqShape>& seqs, int64_t num_heads,
                                   int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                   at::ScalarType dtype, uint64_t seed, int64_t extra_columns = 2) {
  at::manual_seed(seed);
  PagedBatch b;
  b.block_size = block_size;
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  std::vector<int64_t> blocks_needed;
  int64_t total_blocks = 0, num_tokens = 0, max_blocks = 0;
  for (const SeqShape& s : seqs) {
    blocks_needed.push_back((s.seq_len + block_size - 1) / block_size);
    total_blocks += blocks_needed.back();
    max_blocks = std::max(max_blocks, blocks_needed.back());
    num_tokens += s.q_len;
    b.max_q_len = std::max(b.max_q_len, s.q_len);
  }
  const int64_t pool_blocks = total_blocks + 5;
  const auto fopts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor pool = at::full({pool_blocks, 2, num_kv_heads, block_size, head_dim}, NAN, fopts);
  at::Tensor table = at::full({num_seqs, max_blocks + extra_columns}, kPoisonBlockId,
                              at::TensorOptions().dtype(at::kInt));
  at::Tensor perm = at::randperm(pool_blocks, at::TensorOptions().dtype(at::kLong));
  const auto perm_a = perm.accessor<int64_t, 1>();
  auto table_a = table.accessor<int32_t, 2>();
  int64_t next = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t j = 0; j < blocks_needed[s]; ++j) {
      const int64_t block = perm_a[next++];
      table_a[s][j] = static_cast<int32_t>(block);
      const int64_t filled = std::min(block_size, seqs[s].seq_len - j * block_size);
      pool[block].narrow(2, 0, filled).normal_();
    }
  }
  b.kv_cache = pool.to(dtype);
  b.block_tables = table;
  b.q = (at::randn({num_tokens, num_heads, head_dim}, fopts) * 1.5).to(dtype);
  std::vector<int32_t> lens, cu{0};
  for (const SeqShape& s : seqs) {
    lens.push_back(static_cast<int32_t>(s.seq_len));
    cu.push_back(cu.back() + static_cast<int32_t>(s.q_len));
  }
  b.seq_lens = at::tensor(lens, at::TensorOptions().dtype(at::kInt));
  b.cu_q_lens = at::tensor(cu, at::TensorOptions().dtype(at::kInt));
  b.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  return b;
}

// K or V (which = 0 or 1) of sequence s as [seq_len, num_kv_heads, head_dim] float32, gathered
// token by token through the block table.
inline at::Tensor gather_sequence(const PagedBatch& b, int64_t s, int64_t which) {
  const int64_t ctx = b.seq_lens[s].item<int64_t>();
  const at::Tensor positions = at::arange(ctx, at::TensorOptions().dtype(at::kLong));
  const at::Tensor blocks =
      b.block_tables[s].to(at::kLong).index_select(0, positions.div(b.block_size, "floor"));
  const at::Tensor offsets = positions.remainder(b.block_size);
  // [num_blocks, block_size, num_kv_heads, head_dim] view; (block, offset) -> [Hkv, D].
  const at::Tensor kv = b.kv_cache.select(1, which).permute({0, 2, 1, 3});
  return kv.index({blocks, offsets}).to(at::kFloat);
}

// out[t] = softmax(q k^T * scale + causal mask) v per sequence, in float32, cast to q's dtype.
inline at::Tensor reference_paged_attention(const PagedBatch& b) {
  const int64_t num_heads = b.q.size(1);
  const int64_t group = num_heads / b.kv_cache.size(2);
  at::Tensor out = at::zeros(b.q.sizes(), b.q.options().dtype(at::kFloat));
  const at::Tensor qf = b.q.to(at::kFloat);
  for (int64_t s = 0; s < b.seq_lens.size(0); ++s) {
    const int64_t begin = b.cu_q_lens[s].item<int64_t>();
    const int64_t q_len = b.cu_q_lens[s + 1].item<int64_t>() - begin;
    const int64_t ctx = b.seq_lens[s].item<int64_t>();
    if (q_len == 0) continue;
    const at::Tensor k = gather_sequence(b, s, 0).repeat_interleave(group, 1);  // [ctx, H, D]
    const at::Tensor v = gather_sequence(b, s, 1).repeat_interleave(group, 1);
    const at::Tensor qs = qf.narrow(0, begin, q_len);                   // [L, H, D]
    at::Tensor scores = at::einsum("lhd,chd->hlc", {qs, k}) * b.scale;  // [H, L, ctx]
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    const at::Tensor query_pos = at::arange(ctx - q_len, ctx, lopts).unsqueeze(1);
    const at::Tensor key_pos = at::arange(ctx, lopts).unsqueeze(0);
    scores.masked_fill_(key_pos.gt(query_pos), -INFINITY);  // [L, ctx] broadcast over heads
    const at::Tensor probs = at::softmax(scores, -1);
    out.narrow(0, begin, q_len).copy_(at::einsum("hlc,chd->lhd", {probs, v}));
  }
  return out.to(b.q.scalar_type());
}

// kv_cache after writing key/value at slot_mapping, token by token (slot < 0 skips).
inline at::Tensor reference_reshape_and_cache(const at::Tensor& kv_cache, const at::Tensor& key,
                                              const at::Tensor& value,
                                              const at::Tensor& slot_mapping) {
  at::Tensor out = kv_cache.clone();
  const int64_t block_size = kv_cache.size(3);
  const auto slots = slot_mapping.accessor<int64_t, 1>();
  for (int64_t t = 0; t < key.size(0); ++t) {
    if (slots[t] < 0) continue;
    const int64_t block = slots[t] / block_size;
    const int64_t offset = slots[t] % block_size;
    out[block][0].select(1, offset).copy_(key[t]);
    out[block][1].select(1, offset).copy_(value[t]);
  }
  return out;
}

// Inputs of one reshape_and_cache case (the grid of tests/kernels/reshape_and_cache_test.cpp and
// its emulator twin): a random pool of kReshapeBlocks blocks, kReshapeTokens tokens of
// kReshapeKvHeads heads at distinct random slots with every 7th token skipped (slot -1), and K/V
// contiguous or, when `strided`, views of a fused [T, H + 2 Hkv, D] output with H = 2 Hkv.
constexpr int64_t kReshapeKvHeads = 4;
constexpr int64_t kReshapeBlocks = 20;
constexpr int64_t kReshapeTokens = 50;

struct ReshapeAndCacheCase {
  at::Tensor kv_cache;
  at::Tensor key;
  at::Tensor value;
  at::Tensor slots;
};

inline ReshapeAndCacheCase make_reshape_and_cache_case(at::ScalarType dtype, int64_t head_dim,
                                                       int64_t block_size, bool strided) {
  at::manual_seed(head_dim + block_size);
  const auto opts = at::TensorOptions().dtype(dtype);
  ReshapeAndCacheCase c;
  c.kv_cache = at::randn({kReshapeBlocks, 2, kReshapeKvHeads, block_size, head_dim}, opts);
  c.slots = at::randperm(kReshapeBlocks * block_size, at::TensorOptions().dtype(at::kLong))
                .narrow(0, 0, kReshapeTokens)
                .clone();
  c.slots.index_fill_(0, at::arange(0, kReshapeTokens, 7, at::TensorOptions().dtype(at::kLong)),
                      -1);
  if (strided) {
    const at::Tensor fused = at::randn({kReshapeTokens, 4 * kReshapeKvHeads, head_dim}, opts);
    c.key = fused.narrow(1, 2 * kReshapeKvHeads, kReshapeKvHeads);
    c.value = fused.narrow(1, 3 * kReshapeKvHeads, kReshapeKvHeads);
  } else {
    c.key = at::randn({kReshapeTokens, kReshapeKvHeads, head_dim}, opts);
    c.value = at::randn({kReshapeTokens, kReshapeKvHeads, head_dim}, opts);
  }
  return c;
}

// The batch shapes of the test grids, by name, for a given block size.
inline std::vector<SeqShape> batch_shapes(const std::string& kind, int64_t bs) {
  if (kind == "decode") {
    return {{1, 1},  {1, bs - 1}, {1, bs},  {1, bs + 1},
            {1, 37}, {1, 2000},   {1, 130}, {1, 3 * bs + 5}};
  }
  if (kind == "verify") {  // a few tokens per sequence, as speculative decoding verifies
    return {{2, bs + 1}, {1, 2000}, {2, 2}, {2, 50}, {1, 1}};
  }
  if (kind == "chunked") {  // chunked prefill over a cached prefix
    return {{5, 2000}, {1, bs + 1}, {17, 17 + bs}, {bs, 3 * bs}, {64, 164}, {3, 700}};
  }
  if (kind == "prefill") {
    return {{1, 1}, {bs - 1, bs - 1}, {bs + 1, bs + 1}, {77, 77}, {300, 300}};
  }
  // mixed: decode, an idle sequence, a prefill and chunks in one launch
  return {{1, 2000}, {0, 5}, {200, 200}, {1, 1}, {9, 40}, {1, bs}, {33, 1000}};
}

// A paged attention grid case (dtype, head_dim, block_size, GQA group, batch kind) and its test
// name, shared by the GPU test and its emulator twin.
using PagedAttentionCase = std::tuple<at::ScalarType, int64_t, int64_t, int64_t, std::string>;
inline std::string paged_attention_case_name(const PagedAttentionCase& c) {
  return std::string(c10::toString(std::get<0>(c))) + "_d" + std::to_string(std::get<1>(c)) + "_b" +
         std::to_string(std::get<2>(c)) + "_g" + std::to_string(std::get<3>(c)) + "_" +
         std::get<4>(c);
}

}  // namespace strata::kernels::testing
