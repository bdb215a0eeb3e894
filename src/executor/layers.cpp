#include "layers.h"

#include <ATen/ATen.h>

#include <cmath>

#include "strata/kernels/torch_ops.h"

namespace strata::executor {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.is_cuda()) return kernels::rms_norm(x, weight, eps);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
}

RotaryTables make_rotary_tables(const at::Tensor& positions, const at::Tensor& inv_freq,
                                at::ScalarType dtype) {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables) {
  if (x.is_cuda()) return kernels::apply_rotary(x, tables.cos, tables.sin);
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos.unsqueeze(1) + rotated * tables.sin.unsqueeze(1);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t start) {
  const int64_t n = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const bool gqa = q.size(1) != k.size(1);
  if (n == 1) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale, gqa);
  }
  if (start == 0) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale, gqa);
  }
  // Query i (absolute position start + i) sees keys 0 .. start + i.
  const auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
  at::Tensor query_pos = at::arange(start, start + n, opts).unsqueeze(1);
  at::Tensor key_pos = at::arange(0, start + n, opts).unsqueeze(0);
  at::Tensor mask = key_pos <= query_pos;  // [n, start + n], true = attend
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale, gqa);
}

}  // namespace strata::executor
