#include "strata/kernels/krul_ops.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

namespace strata::kernels::aten {

at::Tensor krul_attention_rows(const at::Tensor& q, const at::Tensor& k, int64_t start,
                               double scale) {
  const int64_t r = q.size(0), heads = q.size(1), kv_heads = k.size(1), end = k.size(0);
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(group * kv_heads == heads, "query heads ", heads, " not a multiple of KV heads ",
              kv_heads);
  TORCH_CHECK(start >= 0 && start + r <= end, "rows [", start, ", ", start + r, ") beyond ", end,
              " keys");
  // [kv_heads, group * r, d] x [kv_heads, d, end] -> [heads, r, end]
  const at::Tensor qh = q.to(at::kFloat).permute({1, 0, 2}).reshape({kv_heads, group * r, -1});
  const at::Tensor kt = k.to(at::kFloat).permute({1, 2, 0});
  const at::Tensor logits = at::bmm(qh, kt).mul(scale).reshape({heads, r, end});
  const at::Tensor positions =
      at::arange(start, start + r, q.options().dtype(at::kLong)).unsqueeze(1);
  const at::Tensor keys = at::arange(end, q.options().dtype(at::kLong));
  return at::softmax(logits.masked_fill(keys > positions, -INFINITY), -1);
}

at::Tensor krul_decode_rows(const at::Tensor& q, const at::Tensor& k, double scale) {
  const int64_t layers = q.size(0), heads = q.size(1), t = k.size(1), kv_heads = k.size(2);
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(group * kv_heads == heads && k.size(0) == layers, "krul_decode_rows: q ", q.sizes(),
              ", k ", k.sizes());
  // [layers * kv_heads, group, d] x [layers * kv_heads, d, t]: the last row sees every key.
  const at::Tensor qh = q.to(at::kFloat).reshape({layers * kv_heads, group, -1});
  const at::Tensor kt = k.to(at::kFloat).permute({0, 2, 3, 1}).reshape({layers * kv_heads, -1, t});
  return at::softmax(at::bmm(qh, kt).mul(scale), -1).reshape({layers, heads, 1, t});
}

void krul_accumulate(const at::Tensor& rows, const at::Tensor& lengths,
                     kv::krul::AttentionStats& stats) {
  const int64_t layers = rows.size(0), heads = rows.size(1), r = rows.size(2), t = rows.size(3);
  TORCH_CHECK(layers == stats.num_layers && heads == stats.num_heads, "rows of ", layers, "x",
              heads, " for statistics of ", stats.num_layers, "x", stats.num_heads);
  if (r == 0) return;
  // Each row's edge: its first and last e = max(1, floor(length / 10)) positions.
  const at::Tensor len = lengths.to(rows.device(), at::kLong).unsqueeze(1);  // [r, 1]
  const at::Tensor edge = at::clamp_min(at::floor_divide(len, 10), 1);
  const at::Tensor pos = at::arange(t, len.options());
  const at::Tensor mask = ((pos < edge) | ((pos >= len - edge) & (pos < len))).to(at::kFloat);
  // [layers * heads, r * t] x [r * t]: a matrix-vector product, no temporary of the rows' size
  const at::Tensor mass =
      at::mv(rows.to(at::kFloat).reshape({layers * heads, r * t}), mask.reshape({-1}))
          .reshape({layers, heads})
          .sum(1)
          .to(at::kDouble)
          .cpu();  // [layers]
  const double* m = mass.data_ptr<double>();
  for (int64_t l = 0; l < layers; ++l) {
    stats.edge_mass[static_cast<size_t>(l)] += m[l];
    stats.observed[static_cast<size_t>(l)] += heads * r;
  }
  // Per head, the Gram matrix of the layers' flattened rows, [heads, layers, layers], in float32
  // (BLAS: float64 was 25x slower on the CPU) over rows centred on their mean across layers:
  // distances do not move, and the norms shrink to the scale of the distances, so
  // ||a||^2 + ||b||^2 - 2 a.b cancels little.
  at::Tensor flat = rows.permute({1, 0, 2, 3}).reshape({heads, layers, r * t}).to(at::kFloat);
  flat = flat - flat.mean(1, /*keepdim=*/true);
  const at::Tensor gram = at::bmm(flat, flat.transpose(1, 2)).to(at::kDouble);
  const at::Tensor norms = gram.diagonal(0, 1, 2);  // [heads, layers]
  const at::Tensor sq = at::clamp_min(norms.unsqueeze(2) + norms.unsqueeze(1) - 2 * gram, 0.0)
                            .permute({1, 2, 0})
                            .contiguous()
                            .cpu();
  const double* s = sq.data_ptr<double>();  // [layers (i), layers (j), heads]
  for (int64_t i = 0; i < layers; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      for (int64_t h = 0; h < heads; ++h) {
        stats.squared_at(static_cast<int32_t>(i), static_cast<int32_t>(j),
                         static_cast<int32_t>(h)) += s[(i * layers + j) * heads + h];
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> krul_merge(const at::Tensor& a,
                                                                      const at::Tensor& b, double t,
                                                                      double retain) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.dim() == 3, "krul_merge: a ", a.sizes(), ", b ",
              b.sizes());
  const int64_t d = a.size(2);
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  const at::Tensor ma = at::linalg_vector_norm(af, 2, {-1}),
                   mb = at::linalg_vector_norm(bf, 2, {-1});
  // A zero vector has no direction: it takes the other's (its magnitude 0 restores it exactly).
  const at::Tensor ua = af / ma.clamp_min(1e-30).unsqueeze(-1);
  const at::Tensor ub = bf / mb.clamp_min(1e-30).unsqueeze(-1);
  const at::Tensor cos = (ua * ub).sum(-1).clamp(-1.0, 1.0);
  const at::Tensor omega = at::acos(cos);  // [n, heads]
  const at::Tensor sin = at::sin(omega);
  // SLERP; where the angle is ~0 (or pi), the normalized linear interpolation.
  const at::Tensor small = sin.abs() < 1e-6;
  const at::Tensor wa =
      at::where(small, at::full_like(sin, 1.0 - t), at::sin((1.0 - t) * omega) / sin);
  const at::Tensor wb = at::where(small, at::full_like(sin, t), at::sin(t * omega) / sin);
  at::Tensor e = wa.unsqueeze(-1) * ua + wb.unsqueeze(-1) * ub;
  e = e / at::linalg_vector_norm(e, 2, {-1}, true).clamp_min(1e-30);
  at::Tensor keep = at::zeros_like(omega, omega.options().dtype(at::kBool));
  if (retain > 0 && omega.numel() > 0) {
    const at::Tensor dist = omega / M_PI;
    const double lo = dist.min().item<double>(), hi = dist.max().item<double>();
    keep = dist > lo + (1.0 - retain) * (hi - lo);
  }
  const at::Tensor retained = keep.reshape({-1}).nonzero().reshape({-1});
  const at::Tensor originals = at::stack(
      {a.reshape({-1, d}).index_select(0, retained), b.reshape({-1, d}).index_select(0, retained)});
  return {e.to(a.scalar_type()), at::stack({ma, mb}), retained, originals};
}

at::Tensor krul_unmerge(const at::Tensor& direction, const at::Tensor& magnitude,
                        const at::Tensor& retained, const at::Tensor& originals) {
  const int64_t d = direction.size(-1);
  const at::Tensor e = direction.to(at::kFloat).unsqueeze(0);  // [1, n, heads, d]
  at::Tensor out = (magnitude.to(at::kFloat).unsqueeze(-1) * e).to(direction.scalar_type());
  if (retained.numel() > 0) {
    at::Tensor flat = out.view({2, -1, d});
    flat.index_copy_(1, retained, originals.to(direction.scalar_type()));
  }
  return out;
}

}  // namespace strata::kernels::aten
