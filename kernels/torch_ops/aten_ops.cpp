#include "strata/kernels/aten_ops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace strata::kernels::aten {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

void paged_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& cu_q_lens, double scale) {
  const int64_t num_kv_heads = kv_cache.size(2);
  const int64_t block_size = kv_cache.size(3);
  const int64_t head_dim = kv_cache.size(4);
  const bool gqa = q.size(1) != num_kv_heads;
  const auto cu = cu_q_lens.accessor<int32_t, 1>();
  const auto lens = seq_lens.accessor<int32_t, 1>();
  for (int64_t s = 0; s < seq_lens.size(0); ++s) {
    const int64_t q_begin = cu[s];
    const int64_t q_len = cu[s + 1] - q_begin;
    const int64_t ctx = lens[s];
    if (q_len == 0) continue;
    const int64_t num_blocks = (ctx + block_size - 1) / block_size;
    // One gather of the sequence's blocks, straight into [2, Hkv, blocks, bs, D] (contiguous, so
    // the reshape to [2, Hkv, blocks * bs, D] is a view); K, V: [1, Hkv, ctx, D].
    const at::Tensor gathered =
        kv_cache.permute({1, 2, 0, 3, 4})
            .index_select(2, block_tables.select(0, s).narrow(0, 0, num_blocks))
            .reshape({2, num_kv_heads, num_blocks * block_size, head_dim})
            .narrow(2, 0, ctx);
    const at::Tensor k = gathered.select(0, 0).unsqueeze(0);
    const at::Tensor v = gathered.select(0, 1).unsqueeze(0);
    const at::Tensor qs = q.narrow(0, q_begin, q_len).transpose(0, 1).unsqueeze(0);  // [1,H,L,D]
    at::Tensor o;
    if (q_len == 1) {  // the newest position sees every key
      o = at::scaled_dot_product_attention(qs, k, v, {}, 0.0, false, scale, gqa);
    } else if (q_len == ctx) {
      o = at::scaled_dot_product_attention(qs, k, v, {}, 0.0, /*is_causal=*/true, scale, gqa);
    } else {  // query i (position ctx - q_len + i) sees keys 0 .. ctx - q_len + i
      const auto opts = at::TensorOptions().dtype(at::kLong);
      const at::Tensor query_pos = at::arange(ctx - q_len, ctx, opts).unsqueeze(1);
      const at::Tensor key_pos = at::arange(0, ctx, opts).unsqueeze(0);
      const at::Tensor mask = key_pos.le(query_pos);  // [q_len, ctx], true = attend
      o = at::scaled_dot_product_attention(qs, k, v, mask, 0.0, false, scale, gqa);
    }
    out.narrow(0, q_begin, q_len).copy_(o.squeeze(0).transpose(0, 1));
  }
}

void reshape_and_cache(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& slot_mapping) {
  const int64_t block_size = kv_cache.size(3);
  const at::Tensor valid = slot_mapping.ge(0).nonzero().squeeze(1);  // token indices
  if (valid.size(0) == 0) return;
  const at::Tensor slots = slot_mapping.index_select(0, valid);
  const int64_t max_slot = slots.max().item<int64_t>();
  TORCH_CHECK(max_slot < kv_cache.size(0) * block_size, "slot ", max_slot,
              " is outside the pool of ", kv_cache.size(0), " blocks x ", block_size, " slots");
  const at::Tensor blocks = slots.div(block_size, "floor");
  const at::Tensor offsets = slots.remainder(block_size);
  for (int64_t which = 0; which < 2; ++which) {
    // [num_blocks, block_size, Hkv, D] view of K or V; rows (block, offset) get [Hkv, D].
    at::Tensor dst = kv_cache.select(1, which).permute({0, 2, 1, 3});
    const at::Tensor& src = which == 0 ? key : value;
    dst.index_put_(c10::List<std::optional<at::Tensor>>({blocks, offsets}),
                   src.index_select(0, valid));
  }
}

at::Tensor attention_received(const at::Tensor& q, const at::Tensor& keys, int64_t start,
                              double scale) {
  constexpr int64_t kRows = 128;  // query rows per step
  const int64_t m = q.size(0), num_heads = q.size(1), d = q.size(2), end = start + m;
  const int64_t kv_heads = keys.size(1), group = num_heads / kv_heads;
  TORCH_CHECK(group * kv_heads == num_heads, "query heads ", num_heads,
              " not a multiple of KV heads ", kv_heads);
  TORCH_CHECK(keys.size(0) >= end, "keys of ", keys.size(0), " tokens for queries up to ", end);
  const auto options = q.options().dtype(at::kFloat);
  const at::Tensor k = keys.narrow(0, 0, end).to(at::kFloat).permute({1, 2, 0});  // [Hkv, D, end]
  // A block of rows sees the keys up to its last row: only its last `rows` columns need the
  // causal mask (future[i, j]: key first + j after query first + i).
  const at::Tensor future = at::ones({kRows, kRows}, options.dtype(at::kBool)).triu(1);
  at::Tensor received = at::zeros({num_heads, end}, options);
  for (int64_t row = 0; row < m; row += kRows) {
    const int64_t rows = std::min(kRows, m - row), first = start + row, seen = first + rows;
    // [Hkv, group * rows, D]: query head h = kv * group + g, each against its KV head's keys,
    // the scale on the queries (rows x D values rather than rows x keys).
    const at::Tensor qh = q.narrow(0, row, rows)
                              .to(at::kFloat)
                              .mul(scale)
                              .permute({1, 0, 2})
                              .reshape({kv_heads, group * rows, d});
    at::Tensor logits = at::bmm(qh, k.narrow(2, 0, seen)).view({num_heads, rows, seen});
    logits.narrow(2, first, rows)
        .masked_fill_(future.narrow(0, 0, rows).narrow(1, 0, rows), -INFINITY);
    at::Tensor probs = at::softmax(logits, -1);
    probs.narrow(2, first, rows).diagonal(0, 1, 2).zero_();  // a token's own query excluded
    received.narrow(1, 0, seen) += probs.sum(1);
  }
  return received;
}

}  // namespace strata::kernels::aten
