#include "../common/dispatch.cuh"

namespace strata::kernels {
namespace {

// One block per token; threads cover (head, i) pairs for i < head_dim / 2, each writing the two
// elements i and i + head_dim / 2 of that head.
constexpr int kMaxThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) rotary_kernel(T* __restrict__ out, const T* __restrict__ x,
                              const T* __restrict__ cos, const T* __restrict__ sin,
                              int64_t num_heads, int64_t head_dim) {
  const int64_t token = blockIdx.x;
  const int64_t half = head_dim / 2;
  const T* cos_row = cos + token * head_dim;
  const T* sin_row = sin + token * head_dim;
  for (int64_t idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int64_t head = idx / half;
    const int64_t i = idx % half;
    const int64_t base = (token * num_heads + head) * head_dim;
    const float x1 = to_float(x[base + i]);
    const float x2 = to_float(x[base + i + half]);
    const float lo = round_to<T>(x1 * to_float(cos_row[i])) +
                     round_to<T>(-x2 * to_float(sin_row[i]));
    const float hi = round_to<T>(x2 * to_float(cos_row[i + half])) +
                     round_to<T>(x1 * to_float(sin_row[i + half]));
    out[base + i] = from_float<T>(lo);
    out[base + i + half] = from_float<T>(hi);
  }
}

}  // namespace

void launch_rotary(void* out, const void* x, const void* cos, const void* sin, int64_t num_tokens,
                   int64_t num_heads, int64_t head_dim, DType kind, cudaStream_t stream) {
  if (num_tokens == 0) return;
  const int64_t work = num_heads * head_dim / 2;
  const int threads =
      work >= kMaxThreads ? kMaxThreads : static_cast<int>((work + 31) / 32 * 32);
  STRATA_DISPATCH_SCALAR(kind, [&] {
    launch_kernel(rotary_kernel<scalar_t>, {static_cast<unsigned>(num_tokens),
                                            static_cast<unsigned>(threads), 0, stream},
                  static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x),
                  static_cast<const scalar_t*>(cos), static_cast<const scalar_t*>(sin),
                  num_heads, head_dim);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
