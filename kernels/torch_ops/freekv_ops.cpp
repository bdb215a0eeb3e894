#include "strata/kernels/freekv_ops.h"

#include <ATen/ATen.h>

#include <cmath>

namespace strata::kernels::aten {

std::pair<at::Tensor, at::Tensor> freekv_summaries(const at::Tensor& keys) {
  TORCH_CHECK(keys.dim() == 4, "freekv_summaries: keys [n_page, n_kv, p, d], got ", keys.sizes());
  return {std::get<0>(keys.min(2)), std::get<0>(keys.max(2))};
}

at::Tensor freekv_select(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                         int64_t top_k, double scale) {
  const int64_t heads = q.size(0), pages = kmin.size(0), kv_heads = kmin.size(1);
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(group * kv_heads == heads && kmax.sizes() == kmin.sizes(), "freekv_select: q ",
              q.sizes(), ", kmin ", kmin.sizes(), ", kmax ", kmax.sizes());
  const int64_t k = std::min(top_k, pages);
  if (k <= 0) return at::empty({kv_heads, 0}, q.options().dtype(at::kLong));
  // The upper bound of q . k over a page: sum_c max(q_c hi_c, q_c lo_c) takes hi_c where q_c > 0
  // and lo_c where q_c < 0 (hi >= lo), so it is two products: q+ . kmax + q- . kmin.
  // [kv_heads, group, d] x [kv_heads, d, pages] -> [kv_heads, group, pages].
  const at::Tensor qg = q.to(at::kFloat).view({kv_heads, group, -1});
  const at::Tensor lo = kmin.to(at::kFloat).permute({1, 2, 0});
  const at::Tensor hi = kmax.to(at::kFloat).permute({1, 2, 0});
  const at::Tensor bound =
      at::bmm(qg.clamp_min(0), hi).add_(at::bmm(qg.clamp_max(0), lo)).mul_(scale);
  const at::Tensor score = at::softmax(bound, -1).mean(1);                     // [kv, pages]
  // Stable order on ties: the lower page first (topk's order among equal values is unspecified).
  const at::Tensor order = std::get<1>(at::sort(score, /*stable=*/true, -1, /*descending=*/true));
  return std::get<0>(at::sort(order.narrow(1, 0, k), -1));
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
  TORCH_CHECK(group * kv_heads == heads && cache_k.size(2) == kv_heads &&
                  slots.numel() == kv_heads,
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
    cv = cache_v.narrow(0, 0, used).reshape({-1, kv_heads, d}).to(at::kFloat).permute({1, 0, 2})
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
