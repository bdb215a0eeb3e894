// Rotary tables (private to the executor); the element-wise ops themselves are kernels/torch_ops.h
// (Strata's kernels on CUDA, ATen in the order HF transformers uses on the CPU).
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::executor {

// cos/sin of position * inverse frequency, [num_tokens, head_dim] in `dtype`, laid out as
// [f_0 .. f_{D/2-1}, f_0 .. f_{D/2-1}] to pair dimension i with i + D/2 (NeoX / HF order).
struct RotaryTables {
  at::Tensor cos;
  at::Tensor sin;
};
// positions: [num_tokens] int64; inv_freq: [head_dim / 2] float32.
RotaryTables make_rotary_tables(const at::Tensor& positions, const at::Tensor& inv_freq,
                                at::ScalarType dtype);

}  // namespace strata::executor
