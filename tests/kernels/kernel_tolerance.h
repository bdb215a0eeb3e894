// Tolerances and labels shared by the GPU kernel tests and their emulator twins (emulated/).
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace strata::kernels::testing {

struct Tolerance {
  double atol;
  double rtol;
};

// Our kernels round intermediates like the ATen reference but reduce in a different order, so
// results may differ by about one unit in the last place of the dtype.
inline Tolerance tolerance_for(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return {1e-5, 1e-5};
    case at::kHalf:
      return {2e-3, 2e-3};
    default:
      return {1.6e-2, 1.6e-2};  // bfloat16: 8 mantissa bits
  }
}

inline std::string dtype_label(at::ScalarType dtype) { return std::string(c10::toString(dtype)); }

// Max |a - b| over elements, in float32.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

}  // namespace strata::kernels::testing
