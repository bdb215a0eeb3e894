// GPU micro-benchmark of Strata's element-wise kernels (RMSNorm, rotary embedding), reported as
// ratios: effective bandwidth against the device-to-device copy bandwidth measured in the same
// run (the physical limit for a memory-bound op), and time against the unfused libtorch
// expression they replace (the peer).
//
// usage: kernels_bench [--json PATH]   (exits 0 with a note when no CUDA device is present)

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "gpu_timing.h"
#include "strata/kernels/torch_ops.h"

using strata::bench::time_ms;

int main(int argc, char** argv) {
  std::optional<strata::bench::GpuRun> run =
      strata::bench::start_gpu_run(argc, argv, "kernels_bench");
  if (!run) return 0;
  const double copy_gbps = run->copy_gbps;
  nlohmann::json& results = run->results;
  std::printf("%-8s %-9s %7s %6s %10s %10s %9s %9s\n", "op", "dtype", "tokens", "dim", "ours_us",
              "torch_us", "vs_torch", "vs_copy");

  const auto opts = at::TensorOptions().device(at::kCUDA);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const int64_t elem = at::elementSize(dtype);
    for (int64_t tokens : {1, 64, 1024, 8192}) {
      // RMSNorm over a Llama-3-8B sized hidden state.
      {
        const int64_t hidden = 4096;
        at::Tensor x = at::randn({tokens, hidden}, opts.dtype(dtype));
        at::Tensor w = at::randn({hidden}, opts.dtype(dtype));
        const double ours = time_ms([&] { strata::kernels::rms_norm(x, w, 1e-5); });
        const double torch = time_ms([&] {
          at::Tensor xf = x.to(at::kFloat);
          (void)(w * (xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-5)).to(dtype));
        });
        const double bytes = 2.0 * tokens * hidden * elem + hidden * elem;
        const double frac = bytes / (ours * 1e6) / copy_gbps;
        std::printf("%-8s %-9s %7ld %6ld %10.1f %10.1f %8.2fx %8.0f%%\n", "rmsnorm",
                    c10::toString(dtype), tokens, hidden, ours * 1e3, torch * 1e3, torch / ours,
                    100 * frac);
        results["rows"].push_back({{"op", "rms_norm"}, {"dtype", c10::toString(dtype)},
                                   {"tokens", tokens}, {"dim", hidden}, {"ours_ms", ours},
                                   {"torch_ms", torch}, {"fraction_of_copy_bw", frac}});
      }
      // Rotary on Q of Llama-3-8B: 32 heads x 128.
      {
        const int64_t heads = 32, head_dim = 128;
        at::Tensor x = at::randn({tokens, heads, head_dim}, opts.dtype(dtype));
        at::Tensor cos = at::randn({tokens, head_dim}, opts.dtype(dtype));
        at::Tensor sin = at::randn({tokens, head_dim}, opts.dtype(dtype));
        const double ours = time_ms([&] { strata::kernels::apply_rotary(x, cos, sin); });
        const double torch = time_ms([&] {
          const int64_t half = head_dim / 2;
          at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
          (void)(x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1));
        });
        const double bytes = (2.0 * tokens * heads * head_dim + 2.0 * tokens * head_dim) * elem;
        const double frac = bytes / (ours * 1e6) / copy_gbps;
        std::printf("%-8s %-9s %7ld %6ld %10.1f %10.1f %8.2fx %8.0f%%\n", "rotary",
                    c10::toString(dtype), tokens, heads * head_dim, ours * 1e3, torch * 1e3,
                    torch / ours, 100 * frac);
        results["rows"].push_back({{"op", "rotary"}, {"dtype", c10::toString(dtype)},
                                   {"tokens", tokens}, {"dim", heads * head_dim},
                                   {"ours_ms", ours}, {"torch_ms", torch},
                                   {"fraction_of_copy_bw", frac}});
      }
    }
  }
  strata::bench::finish_gpu_run(*run);
  return 0;
}
