// Host launchers of Strata's CUDA kernels. Framework-free: raw device pointers, sizes and a
// stream. Every launcher checks its launch with STRATA_CUDA_CHECK semantics (aborts on a CUDA
// error, which is a broken invariant at this level); inputs are validated by the callers
// (kernels/torch_ops).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::kernels {

enum class ScalarKind { kFloat32, kFloat16, kBFloat16 };

// out[r, :] = weight * (x[r, :] * rsqrt(mean(x[r, :]^2) + eps)), statistics in float32.
// x, out: [num_rows, hidden] contiguous; weight: [hidden]; all of `kind`.
void launch_rms_norm(void* out, const void* x, const void* weight, int64_t num_rows,
                     int64_t hidden, float eps, ScalarKind kind, cudaStream_t stream);

// NeoX-style rotary embedding: for i < D/2,
//   out[t, h, i]       = x[t, h, i] * cos[t, i] - x[t, h, i + D/2] * sin[t, i]
//   out[t, h, i + D/2] = x[t, h, i + D/2] * cos[t, i + D/2] + x[t, h, i] * sin[t, i + D/2]
// x, out: [num_tokens, num_heads, head_dim] contiguous; cos, sin: [num_tokens, head_dim].
// Products are rounded to `kind` before the sum, as the unfused ATen expression does.
void launch_rotary(void* out, const void* x, const void* cos, const void* sin, int64_t num_tokens,
                   int64_t num_heads, int64_t head_dim, ScalarKind kind, cudaStream_t stream);

}  // namespace strata::kernels
