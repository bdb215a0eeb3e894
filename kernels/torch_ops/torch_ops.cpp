#include "strata/kernels/torch_ops.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

ScalarKind scalar_kind(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ScalarKind::kFloat32;
    case at::kHalf: return ScalarKind::kFloat16;
    case at::kBFloat16: return ScalarKind::kBFloat16;
    default: TORCH_CHECK(false, "unsupported dtype ", t.scalar_type());
  }
}

void check_input(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(),
              ", expected ", like.scalar_type());
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), ", expected ",
              like.device());
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_input(x, "x", x);
  check_input(weight, "weight", x);
  TORCH_CHECK(x.dim() == 2, "x must be [num_rows, hidden], got ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), "weight must be [", x.size(1),
              "], got ", weight.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  launch_rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), x.size(0), x.size(1),
                  static_cast<float>(eps), scalar_kind(x),
                  c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  return out;
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_input(x, "x", x);
  check_input(cos, "cos", x);
  check_input(sin, "sin", x);
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0,
              "x must be [num_tokens, num_heads, even head_dim], got ", x.sizes());
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == x.size(0) && cos.size(1) == x.size(2),
              "cos must be [", x.size(0), ", ", x.size(2), "], got ", cos.sizes());
  TORCH_CHECK(sin.sizes() == cos.sizes(), "sin must match cos, got ", sin.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  launch_rotary(out.data_ptr(), x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.size(0),
                x.size(1), x.size(2), scalar_kind(x),
                c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  return out;
}

}  // namespace strata::kernels
