// Timing helpers shared by the GPU benchmarks (header-only; benchmarks are single files).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace strata::bench {

// Warms up, then averages `iters` launches of `fn` on the current stream with CUDA events (ms).
inline double time_ms(const std::function<void()>& fn, int iters = 30) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaEventRecord(start, stream);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

// Device-to-device copy bandwidth, bytes read + written per second / 1e9, for a buffer of
// `bytes`: the limit a memory-bound kernel is measured against.
inline double copy_bandwidth_gbps(int64_t bytes) {
  at::Tensor src = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  at::Tensor dst = at::empty_like(src);
  const double ms = time_ms([&] { dst.copy_(src); });
  return 2.0 * bytes / (ms * 1e6);
}

}  // namespace strata::bench
