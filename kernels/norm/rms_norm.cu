#include "../common/dispatch.cuh"

namespace strata::kernels {
namespace {

// One block per row. Each thread accumulates a strided slice of x^2 in float32.
constexpr int kMaxThreads = 1024;

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(T* __restrict__ out, const T* __restrict__ x,
                                const T* __restrict__ weight, int64_t hidden, float eps) {
  const T* row = x + blockIdx.x * hidden;
  T* out_row = out + blockIdx.x * hidden;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = to_float(row[i]);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    // Normalised value is rounded to T before the weight multiply, as in the reference.
    const float normed = round_to<T>(to_float(row[i]) * inv_rms);
    out_row[i] = from_float<T>(to_float(weight[i]) * normed);
  }
}

}  // namespace

void launch_rms_norm(void* out, const void* x, const void* weight, int64_t num_rows,
                     int64_t hidden, float eps, DType kind, cudaStream_t stream) {
  if (num_rows == 0) return;
  const int threads =
      hidden >= kMaxThreads ? kMaxThreads : static_cast<int>((hidden + 31) / 32 * 32);
  STRATA_DISPATCH_SCALAR(kind, [&] {
    launch_kernel(rms_norm_kernel<scalar_t>, {static_cast<unsigned>(num_rows),
                                              static_cast<unsigned>(threads), 0, stream},
                  static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x),
                  static_cast<const scalar_t*>(weight), hidden, eps);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
