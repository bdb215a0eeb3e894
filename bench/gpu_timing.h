// What the GPU benchmarks share (header-only; benchmarks are single files): timing, the copy
// bandwidth their ratios are against, and their start and end (--json PATH).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

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

// One benchmark run: where its JSON goes, the device-to-device copy bandwidth, and the results
// ({"device", "copy_gbps", "rows": []}).
struct GpuRun {
  std::string json_path;
  double copy_gbps = 0;
  nlohmann::json results;
};

// Reads --json PATH, prints the device and its copy bandwidth; nullopt (after a note naming
// `name`) when no CUDA device is present.
inline std::optional<GpuRun> start_gpu_run(int argc, char** argv, const char* name) {
  GpuRun run;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) run.json_path = argv[++i];
  }
  if (c10::cuda::device_count() == 0) {
    std::printf("%s: no CUDA device; nothing measured\n", name);
    return std::nullopt;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  run.copy_gbps = copy_bandwidth_gbps(int64_t{1} << 30);
  std::printf("device %s, D2D copy %.0f GB/s\n", prop.name, run.copy_gbps);
  run.results = {
      {"device", prop.name}, {"copy_gbps", run.copy_gbps}, {"rows", nlohmann::json::array()}};
  return run;
}

// Writes the results to --json's path, if one was given.
inline void finish_gpu_run(const GpuRun& run) {
  if (!run.json_path.empty()) std::ofstream(run.json_path) << run.results.dump(2) << "\n";
}

}  // namespace strata::bench
