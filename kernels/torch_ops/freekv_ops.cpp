#include "strata/kernels/freekv_ops.h"

#include <ATen/ATen.h>

#include <cmath>

namespace strata::kernels::aten {

std::pair<at::Tensor, at::Tensor> freekv_summaries(const at::Tensor& keys) {
  TORCH_CHECK(keys.dim() == 4, "freekv_summaries: keys [n_page, n_kv, p, d], got ", keys.sizes());
  return {std::get<0>(keys.min(2)), std::get<0>(keys.max(2))};
}

at::Tensor freekv_page_scores(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                              double scale) {
  const int64_t heads = q.size(0), kv_heads = kmin.size(1);
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(group * kv_heads == heads && kmax.sizes() == kmin.sizes(), "freekv_page_scores: q ",
              q.sizes(), ", kmin ", kmin.sizes(), ", kmax ", kmax.sizes());
  // The upper bound of q . k over a page: sum_c max(q_c hi_c, q_c lo_c) takes hi_c where q_c > 0
  // and lo_c where q_c < 0 (hi >= lo), so it is two products: q+ . kmax + q- . kmin.
  // [kv_heads, group, d] x [kv_heads, d, pages] -> [kv_heads, group, pages].
  const at::Tensor qg = q.to(at::kFloat).view({kv_heads, group, -1});
  const at::Tensor lo = kmin.to(at::kFloat).permute({1, 2, 0});
  const at::Tensor hi = kmax.to(at::kFloat).permute({1, 2, 0});
  const at::Tensor bound =
      at::bmm(qg.clamp_min(0), hi).add_(at::bmm(qg.clamp_max(0), lo)).mul_(scale);
  return at::softmax(bound, -1).mean(1);
}

at::Tensor freekv_select(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                         int64_t top_k, double scale) {
  const int64_t k = std::min(top_k, kmin.size(0));
  if (k <= 0) return at::empty({kmin.size(1), 0}, q.options().dtype(at::kLong));
  const at::Tensor score = freekv_page_scores(q, kmin, kmax, scale);  // [kv, pages]
  // Stable order on ties: the lower page first (topk's order among equal values is unspecified).
  const at::Tensor order = std::get<1>(at::sort(score, /*stable=*/true, -1, /*descending=*/true));
  return std::get<0>(at::sort(order.narrow(1, 0, k), -1));
}

void check_freekv_offload(const at::Tensor& rows_k, const at::Tensor& rows_v,
                          const at::Tensor& page, const at::Tensor& kmin, const at::Tensor& kmax) {
  TORCH_CHECK(
      rows_k.dim() == 3 && rows_v.sizes() == rows_k.sizes() &&
          page.sizes() == at::IntArrayRef({rows_k.size(1), 2, rows_k.size(0), rows_k.size(2)}) &&
          kmin.sizes() == at::IntArrayRef({rows_k.size(1), rows_k.size(2)}) &&
          kmax.sizes() == kmin.sizes(),
      "freekv_offload: rows ", rows_k.sizes(), ", page ", page.sizes(), ", kmin ", kmin.sizes(),
      ", kmax ", kmax.sizes());
}

void check_freekv_recall(const at::Tensor& chunks, const at::Tensor& items,
                         const at::Tensor& cache_k, const at::Tensor& cache_v,
                         const at::Tensor& from_k, const at::Tensor& from_v) {
  TORCH_CHECK(items.dim() == 2 && items.size(1) == 3 && chunks.dim() == 4 && chunks.size(1) == 2 &&
                  cache_k.dim() == 4 && chunks.size(2) == cache_k.size(1) &&
                  chunks.size(3) == cache_k.size(3) && cache_v.sizes() == cache_k.sizes() &&
                  from_k.sizes() == cache_k.sizes() && from_v.sizes() == cache_k.sizes(),
              "freekv_recall: chunks ", chunks.sizes(), ", items ", items.sizes(), ", cache ",
              cache_k.sizes(), ", from ", from_k.sizes());
}

void freekv_offload(const at::Tensor& rows_k, const at::Tensor& rows_v, at::Tensor& page,
                    at::Tensor& kmin, at::Tensor& kmax) {
  check_freekv_offload(rows_k, rows_v, page, kmin, kmax);
  page.select(1, 0).copy_(rows_k.permute({1, 0, 2}));
  page.select(1, 1).copy_(rows_v.permute({1, 0, 2}));
  auto [lo, hi] = freekv_summaries(page.select(1, 0).unsqueeze(0));
  kmin.copy_(lo.squeeze(0));
  kmax.copy_(hi.squeeze(0));
}

void freekv_recall(const at::Tensor& chunks, const at::Tensor& items, at::Tensor& cache_k,
                   at::Tensor& cache_v, const at::Tensor& from_k, const at::Tensor& from_v) {
  check_freekv_recall(chunks, items, cache_k, cache_v, from_k, from_v);
  const at::Tensor rows = items.to(at::kCPU, at::kLong);
  const int64_t n = rows.size(0);
  if (n == 0) return;
  const at::Tensor head = rows.select(1, 0), slot = rows.select(1, 1), source = rows.select(1, 2);
  TORCH_CHECK(head.min().item<int64_t>() >= 0 && head.max().item<int64_t>() < cache_k.size(2) &&
                  slot.min().item<int64_t>() >= 0 && slot.max().item<int64_t>() < cache_k.size(0) &&
                  source.min().item<int64_t>() >= -from_k.size(0) &&
                  source.max().item<int64_t>() < chunks.size(0),
              "freekv_recall: an item lies outside the tensors");
  // Every item's [p, d] keys and values from its source, then written with one index_put_ per
  // tensor: cache[slot, :, head, :] (advanced indices split by a slice: [n, p, d]). A recall of
  // deltas only may come with no chunk at all.
  const at::Tensor from_chunks = source.ge(0);
  const at::Tensor chunk_rows =
      chunks.size(0) > 0 ? chunks.index_select(0, source.clamp_min(0).to(chunks.device()))
                         : at::zeros({n, 2, chunks.size(2), chunks.size(3)}, chunks.options());
  auto gather = [&](const at::Tensor& from, int64_t kv) {
    const at::Tensor other = from.index({(-source - 1).clamp_min(0).to(from.device()),
                                         at::indexing::Slice(), head.to(from.device())});
    return at::where(from_chunks.to(from.device()).view({n, 1, 1}), chunk_rows.select(1, kv),
                     other);
  };
  const at::Tensor keys = gather(from_k, 0), values = gather(from_v, 1);
  const c10::List<std::optional<at::Tensor>> index = {slot.to(cache_k.device()), std::nullopt,
                                                      head.to(cache_k.device())};
  cache_k.index_put_(index, keys);
  cache_v.index_put_(index, values);
}

at::Tensor freekv_query_similarity(const at::Tensor& q, const at::Tensor& q_prev,
                                   int64_t num_kv_heads) {
  TORCH_CHECK(q.sizes() == q_prev.sizes() && q.size(0) % num_kv_heads == 0,
              "freekv_query_similarity: q ", q.sizes(), ", q_prev ", q_prev.sizes());
  const at::Tensor cos = at::cosine_similarity(q.to(at::kFloat), q_prev.to(at::kFloat), 1);
  return cos.view({num_kv_heads, -1}).mean(1);
}

at::Tensor freekv_attention(const at::Tensor& q, const at::Tensor& resident_k,
                            const at::Tensor& resident_v, const at::Tensor& cache_k,
                            const at::Tensor& cache_v, const at::Tensor& slots, double scale) {
  const int64_t heads = q.size(0), kv_heads = resident_k.size(1), d = q.size(1);
  const int64_t group = heads / kv_heads, p = cache_k.size(1), t = resident_k.size(0);
  TORCH_CHECK(group * kv_heads == heads && cache_k.size(2) == kv_heads && slots.numel() == kv_heads,
              "freekv_attention: q ", q.sizes(), ", resident ", resident_k.sizes(), ", cache ",
              cache_k.sizes(), ", slots ", slots.sizes());
  const int64_t used = slots.numel() > 0 ? slots.max().item<int64_t>() : 0;
  // Logits of the resident keys and of the cache's first `used` slots, one softmax over both;
  // no copy of the keys or values into one tensor. [kv_heads, group, d] x [kv_heads, d, n].
  const at::Tensor qg = q.to(at::kFloat).view({kv_heads, group, d});
  at::Tensor logits = at::bmm(qg, resident_k.to(at::kFloat).permute({1, 2, 0}));
  at::Tensor cv;
  if (used > 0) {
    // A head's keys past its own slots are masked, and their values zeroed (a masked NaN would
    // still poison the product).
    const at::Tensor ck = cache_k.narrow(0, 0, used).reshape({-1, kv_heads, d});
    const at::Tensor index = at::arange(used * p, q.options().dtype(at::kLong));
    const at::Tensor masked = index.unsqueeze(0) >= (slots.to(q.device()) * p).unsqueeze(1);
    cv = cache_v.narrow(0, 0, used)
             .reshape({-1, kv_heads, d})
             .to(at::kFloat)
             .permute({1, 0, 2})
             .masked_fill(masked.unsqueeze(2), 0.0);
    const at::Tensor cached = at::bmm(qg, ck.to(at::kFloat).permute({1, 2, 0}))
                                  .masked_fill(masked.unsqueeze(1), -INFINITY);
    logits = at::cat({logits, cached}, -1);
  }
  const at::Tensor probs = at::softmax(logits.mul_(scale), -1);  // [kv, group, t + used * p]
  at::Tensor out = at::bmm(probs.narrow(2, 0, t), resident_v.to(at::kFloat).permute({1, 0, 2}));
  if (used > 0) out.add_(at::bmm(probs.narrow(2, t, used * p), cv));
  return out.reshape({heads, d}).to(q.scalar_type());
}

}  // namespace strata::kernels::aten
