// at::Tensor adapters over the launchers in ops.h: the only place kernels meet libtorch. Each
// checks device, dtype, shape and contiguity (throwing c10::Error with a clear message, as ATen
// ops do) and launches on the tensor's current CUDA stream.
#pragma once

namespace at {
class Tensor;
}

namespace strata::kernels {

// See launch_rms_norm. x: [num_rows, hidden] CUDA float32/float16/bfloat16; weight: [hidden].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// See launch_rotary. x: [num_tokens, num_heads, head_dim]; cos, sin: [num_tokens, head_dim].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace strata::kernels
