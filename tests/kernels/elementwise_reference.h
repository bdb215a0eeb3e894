// Plain libtorch references for the element-wise kernels (rms_norm, rotary) and their inputs,
// shared by the GPU tests (tests/kernels) and the emulator tests (tests/kernels/emulated).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace strata::kernels::testing {

inline at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return w * normed.to(x.scalar_type());
}

inline at::Tensor reference_rotary(const at::Tensor& x, const at::Tensor& cos,
                                   const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

// Real RoPE tables (theta 1e6 for head_dim 128, 1e4 otherwise) at random positions < 32768:
// cos, sin [num_tokens, head_dim] in `dtype` on `device`.
struct RopeTables {
  at::Tensor cos;
  at::Tensor sin;
};
inline RopeTables rope_tables(int64_t num_tokens, int64_t head_dim, at::ScalarType dtype,
                              at::Device device) {
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(device);
  const double theta = head_dim == 128 ? 1e6 : 1e4;
  at::Tensor inv_freq =
      1.0 / at::pow(theta, at::arange(0, head_dim, 2, fopts) / static_cast<double>(head_dim));
  at::Tensor positions = at::randint(0, 32768, {num_tokens}, fopts);
  at::Tensor freqs = positions.unsqueeze(1) * inv_freq.unsqueeze(0);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

}  // namespace strata::kernels::testing
