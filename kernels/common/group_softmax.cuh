// In-place softmax of a query group's logit rows, for decode attention kernels that serve the G
// query heads of one KV head in one thread block (LeanKV's, FreeKV's): logits
// [G, row_stride] float (global workspace), row g's first `total` entries become probabilities.
// Each thread passes the running maximum of the logits it wrote; `reduce` and `stat` are the
// caller's shared arrays. Ends with a barrier, so the probabilities are visible to every thread.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda_compat.cuh"

namespace strata::kernels {

template <int kMaxGroup, int kWarps>
__device__ __forceinline__ void group_softmax(float* logits, int64_t row_stride, int total,
                                              int group, const float (&running_max)[kMaxGroup],
                                              float (&reduce)[kWarps][kMaxGroup],
                                              float (&stat)[2][kMaxGroup]) {
  constexpr int kThreads = kWarps * 32;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    float m = running_max[g];
    for (int offset = 16; offset > 0; offset /= 2)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (lane == 0) reduce[warp][g] = m;
  }
  __syncthreads();
  if (tid < kMaxGroup) {
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, reduce[w][tid]);
    stat[0][tid] = m;
  }
  __syncthreads();
  float sum[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) sum[g] = 0.0f;
  for (int i = tid; i < total; i += kThreads) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        const float e = __expf(logits[g * row_stride + i] - stat[0][g]);
        logits[g * row_stride + i] = e;
        sum[g] += e;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    float v = sum[g];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) reduce[warp][g] = v;
  }
  __syncthreads();
  if (tid < kMaxGroup) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += reduce[w][tid];
    stat[1][tid] = 1.0f / v;
  }
  __syncthreads();
  for (int i = tid; i < total; i += kThreads) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) logits[g * row_stride + i] *= stat[1][g];
    }
  }
  __syncthreads();
}

}  // namespace strata::kernels
