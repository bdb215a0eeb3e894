#include "strata/kernels/leankv_ops.h"

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "strata/kernels/kv_format_ops.h"

namespace strata::kernels::aten {
namespace {

using kv::leankv::PageFormat;
using kv::leankv::PageSegments;
using kv::leankv::Precision;

constexpr int64_t kQueryChunk = 256;  // query rows per step of leankv_prompt_scores

kv::TensorFormat token_format(int32_t bits, int64_t head_dim) {
  const DType dtype = bits == 8 ? DType::kInt8 : bits == 4 ? DType::kInt4 : DType::kInt2;
  return {dtype, kv::Grouping::kPerToken, static_cast<int32_t>(head_dim)};
}

// Flat byte indices into the pool of a [n, width]-byte segment whose token rows start at
// page * page_bytes + offset + slot * width.
at::Tensor row_indices(const at::Tensor& page, const at::Tensor& slot, int64_t page_bytes,
                       int64_t offset, int64_t width) {
  const at::Tensor start = page * page_bytes + offset + slot * width;
  return start.unsqueeze(1) + at::arange(width, page.options());
}

// Flat byte indices of n tokens' chunked data: chunk c of the token at `slot` lies at
// offset + (c * T + slot) * C. Returns [n, data_bytes] in the token's byte order.
at::Tensor data_indices(const at::Tensor& page, const at::Tensor& slot, int64_t page_bytes,
                        int64_t offset, int64_t tokens, int64_t chunk, int64_t data_bytes) {
  const at::Tensor chunks = at::arange(data_bytes / chunk, page.options());
  const at::Tensor start = (page * page_bytes + offset).view({-1, 1, 1}) +
                           ((chunks.view({1, -1, 1}) * tokens + slot.view({-1, 1, 1})) * chunk);
  return (start + at::arange(chunk, page.options()).view({1, 1, -1})).reshape({page.size(0), -1});
}

// One tensor (K or V) of n tokens, quantized per token: data [n, d*bits/8] and params [n, 4]
// (fp16 scale, fp16 zero) as bytes.
std::pair<at::Tensor, at::Tensor> quantize(const at::Tensor& x, int32_t bits) {
  const int64_t n = x.size(0), d = x.size(1);
  const kv::TensorFormat f = token_format(bits, d);
  const kv::TensorLayout layout = kv::tensor_layout(f, 1, n, d);
  const at::Tensor bytes = pack_kv(x.unsqueeze(0), f);
  const at::Tensor data = bytes.slice(0, 0, layout.data_bytes).view({n, -1});
  const at::Tensor scale = bytes.slice(0, layout.scales_offset, layout.scales_offset + 2 * n);
  const at::Tensor zero = bytes.slice(0, layout.zeros_offset, layout.zeros_offset + 2 * n);
  return {data, at::cat({scale.view({n, 2}), zero.view({n, 2})}, 1)};
}

at::Tensor dequantize(const at::Tensor& data, const at::Tensor& params, int32_t bits, int64_t d) {
  const int64_t n = data.size(0);
  const kv::TensorFormat f = token_format(bits, d);
  const kv::TensorLayout layout = kv::tensor_layout(f, 1, n, d);
  at::Tensor bytes = at::zeros({layout.total_bytes}, data.options());
  bytes.slice(0, 0, layout.data_bytes).copy_(data.reshape({-1}));
  bytes.slice(0, layout.scales_offset, layout.scales_offset + 2 * n)
      .copy_(params.slice(1, 0, 2).reshape({-1}));
  bytes.slice(0, layout.zeros_offset, layout.zeros_offset + 2 * n)
      .copy_(params.slice(1, 2, 4).reshape({-1}));
  return unpack_kv(bytes, f, 1, n, d).squeeze(0);
}

// A 1-D tensor's elements as byte rows [n, element size].
at::Tensor as_bytes(const at::Tensor& t) {
  return t.contiguous().view(at::kByte).view({t.size(0), static_cast<int64_t>(t.element_size())});
}

void write_acc(at::Tensor& pool, const PageFormat& format, Precision precision,
               const at::Tensor& page, const at::Tensor& slot, const at::Tensor& acc) {
  const at::Tensor idx =
      row_indices(page, slot, format.page_bytes(), format.segments(precision).scores, 4);
  pool.view({-1}).index_put_({idx.reshape({-1})}, as_bytes(acc.to(at::kFloat)).reshape({-1}));
}

}  // namespace

at::Tensor leankv_prompt_scores(const at::Tensor& q, const at::Tensor& k, double scale) {
  const int64_t n = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(group * kv_heads == heads, "query heads ", heads, " not a multiple of KV heads ",
              kv_heads);
  // [kv_heads, group, n, d] and [kv_heads, 1, d, n]
  const at::Tensor qh = q.to(at::kFloat).permute({1, 0, 2}).reshape({kv_heads, group, n, -1});
  const at::Tensor kt = k.to(at::kFloat).permute({1, 2, 0}).unsqueeze(1);
  at::Tensor sums = at::zeros({kv_heads, group, n}, q.options().dtype(at::kFloat));
  const at::Tensor keys = at::arange(n, q.options().dtype(at::kLong));
  for (int64_t begin = 0; begin < n; begin += kQueryChunk) {
    const int64_t end = std::min(n, begin + kQueryChunk);
    const at::Tensor rows = keys.slice(0, begin, end).unsqueeze(1);
    // Query j sees keys <= j; a key's received attention counts only from later queries.
    const at::Tensor logits =
        at::matmul(qh.slice(2, begin, end), kt).mul(scale).masked_fill(keys > rows, -INFINITY);
    sums += at::softmax(logits, -1).masked_fill(keys >= rows, 0.0).sum(2);
  }
  return std::get<0>(sums.max(1));
}

void leankv_write_tokens(at::Tensor& pool, const PageFormat& format, Precision precision,
                         const at::Tensor& page, const at::Tensor& slot, const at::Tensor& key,
                         const at::Tensor& value, const at::Tensor& acc,
                         const at::Tensor& position) {
  if (page.numel() == 0) return;
  const PageSegments& s = format.segments(precision);
  const kv::leankv::PrecisionBits& bits = format.bits(precision);
  const int64_t pb = format.page_bytes();
  at::Tensor flat = pool.view({-1});
  auto put = [&](const at::Tensor& idx, const at::Tensor& bytes) {
    flat.index_put_({idx.reshape({-1})}, bytes.reshape({-1}));
  };
  const auto [key_data, key_params] = quantize(key, bits.key);
  const auto [value_data, value_params] = quantize(value, bits.value);
  put(data_indices(page, slot, pb, s.key_data, s.tokens, s.key_chunk, key_data.size(1)), key_data);
  put(row_indices(page, slot, pb, s.key_params, 4), key_params);
  put(data_indices(page, slot, pb, s.value_data, s.tokens, s.value_chunk, value_data.size(1)),
      value_data);
  put(row_indices(page, slot, pb, s.value_params, 4), value_params);
  put(row_indices(page, slot, pb, s.scores, 4), as_bytes(acc.to(at::kFloat)));
  put(row_indices(page, slot, pb, s.positions, 4), as_bytes(position.to(at::kInt)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> leankv_read_tokens(
    const at::Tensor& pool, const PageFormat& format, Precision precision, const at::Tensor& page,
    const at::Tensor& slot) {
  const PageSegments& s = format.segments(precision);
  const kv::leankv::PrecisionBits& bits = format.bits(precision);
  const int64_t pb = format.page_bytes(), d = format.head_dim(), n = page.size(0);
  if (n == 0) {
    const at::TensorOptions options = pool.options();
    return {at::empty({0, d}, options.dtype(at::kFloat)),
            at::empty({0, d}, options.dtype(at::kFloat)), at::empty({0}, options.dtype(at::kFloat)),
            at::empty({0}, options.dtype(at::kInt))};
  }
  const at::Tensor flat = pool.view({-1});
  auto take = [&](const at::Tensor& idx) {
    return flat.index_select(0, idx.reshape({-1})).view({n, -1});
  };
  at::Tensor key = dequantize(
      take(data_indices(page, slot, pb, s.key_data, s.tokens, s.key_chunk, d * bits.key / 8)),
      take(row_indices(page, slot, pb, s.key_params, 4)), bits.key, d);
  at::Tensor value = dequantize(
      take(data_indices(page, slot, pb, s.value_data, s.tokens, s.value_chunk, d * bits.value / 8)),
      take(row_indices(page, slot, pb, s.value_params, 4)), bits.value, d);
  at::Tensor acc = take(row_indices(page, slot, pb, s.scores, 4)).view(at::kFloat).view({n});
  at::Tensor position = take(row_indices(page, slot, pb, s.positions, 4)).view(at::kInt).view({n});
  return {key, value, acc, position};
}

std::pair<at::Tensor, at::Tensor> leankv_token_slots(const PageFormat& format, Precision precision,
                                                     const at::Tensor& tables,
                                                     const at::Tensor& token_counts,
                                                     int64_t entry) {
  const int64_t count = token_counts[entry][static_cast<int64_t>(precision)].item<int64_t>();
  const int64_t per_page = format.tokens_per_page(precision), w = tables.size(1);
  const at::Tensor i = at::arange(count, tables.options().dtype(at::kLong));
  const at::Tensor column =
      precision == Precision::kHigh ? i.div(per_page, "floor") : (w - 1) - i.div(per_page, "floor");
  return {tables[entry].to(at::kLong).index_select(0, column), i.remainder(per_page)};
}

at::Tensor leankv_decode_attention(const at::Tensor& q, at::Tensor& pool, const PageFormat& format,
                                   const at::Tensor& tables, const at::Tensor& token_counts,
                                   const at::Tensor& entries, const at::Tensor& window,
                                   const at::Tensor& window_lens, at::Tensor& window_acc,
                                   double scale) {
  const int64_t num_seqs = q.size(0), heads = q.size(1), kv_heads = entries.size(1);
  const int64_t group = heads / kv_heads;
  at::Tensor out = at::empty_like(q);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t window_len = window_lens[s].item<int64_t>();
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t e = entries[s][h].item<int64_t>();
      std::vector<at::Tensor> keys, values, accs;
      std::vector<std::pair<at::Tensor, at::Tensor>> slots;
      for (Precision p : {Precision::kHigh, Precision::kLow}) {
        slots.push_back(leankv_token_slots(format, p, tables, token_counts, e));
        auto [key, value, acc, position] =
            leankv_read_tokens(pool, format, p, slots.back().first, slots.back().second);
        keys.push_back(key);
        values.push_back(value);
        accs.push_back(acc);
      }
      keys.push_back(window[s][0][h].slice(0, 0, window_len).to(at::kFloat));
      values.push_back(window[s][1][h].slice(0, 0, window_len).to(at::kFloat));
      const at::Tensor qg = q[s].slice(0, h * group, (h + 1) * group).to(at::kFloat);
      const at::Tensor probs = at::softmax(at::matmul(qg, at::cat(keys).t()).mul(scale), -1);
      out[s].slice(0, h * group, (h + 1) * group).copy_(at::matmul(probs, at::cat(values)));
      const at::Tensor received = std::get<0>(probs.max(0));
      int64_t at_token = 0;
      for (Precision p : {Precision::kHigh, Precision::kLow}) {
        const auto& [page, slot] = slots[static_cast<int>(p)];
        const int64_t m = page.size(0);
        write_acc(pool, format, p, page, slot,
                  accs[static_cast<int>(p)] + received.slice(0, at_token, at_token + m));
        at_token += m;
      }
      window_acc[s][h].slice(0, 0, window_len) += received.slice(0, at_token);
    }
  }
  return out;
}

}  // namespace strata::kernels::aten
