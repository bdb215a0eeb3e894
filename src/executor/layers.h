// Transformer building blocks on at::Tensor (private to the executor). Each has one contract for
// every device; on CUDA the element-wise ones run Strata's fused kernels (kernels/), on CPU the
// same math runs as ATen ops in the order HF transformers uses, so fp32 results match it closely.
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::executor {

// y = weight * (x / sqrt(mean(x^2) + eps)), statistics in float32, result in x's dtype.
// x: [num_tokens, hidden]; weight: [hidden].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// cos/sin of position * inverse frequency, [num_tokens, head_dim] in `dtype`, laid out as
// [f_0 .. f_{D/2-1}, f_0 .. f_{D/2-1}] to pair dimension i with i + D/2 (NeoX / HF order).
struct RotaryTables {
  at::Tensor cos;
  at::Tensor sin;
};
// positions: [num_tokens] int64; inv_freq: [head_dim / 2] float32.
RotaryTables make_rotary_tables(const at::Tensor& positions, const at::Tensor& inv_freq,
                                at::ScalarType dtype);

// x * cos + rotate_half(x) * sin for x: [num_tokens, num_heads, head_dim].
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables);

}  // namespace strata::executor
