#include "layers.h"

#include <ATen/ATen.h>

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

}  // namespace strata::executor
