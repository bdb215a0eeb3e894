// GPU benchmark of paged attention (kernels/attention/paged_attention.cu), reported as ratios:
// decode's effective bandwidth (bytes of K/V read + q and out) against the device-to-device copy
// bandwidth measured in the same run (the limit of a memory-bound op), and time against
// at::scaled_dot_product_attention on the same shapes with contiguous K/V (enable_gqa), the
// peer that needs no paging. Shapes: Llama-3-8B attention (32 q heads, 8 kv heads, head_dim 128),
// bf16, block size 16, blocks shuffled over the pool; decode for context {1K, 4K, 16K, 32K} x
// batch {1, 8, 32, 128} (combinations that do not fit in memory are skipped), and a causal
// prefill of one sequence, reported in TFLOP/s.
//
// usage: attention_bench [--json PATH]   (exits 0 with a note when no CUDA device is present)

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "gpu_timing.h"
#include "strata/kernels/torch_ops.h"

namespace {

using strata::bench::time_ms;

constexpr int64_t kHeads = 32;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kBlockSize = 16;


size_t free_device_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  return free_bytes;
}

// SDPA time, or nullopt when it fails (out of memory, no kernel for the shape).
std::optional<double> time_torch(const std::function<void()>& fn) {
  try {
    return time_ms(fn);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "sdpa failed: %s\n", e.what_without_backtrace());
    c10::cuda::CUDACachingAllocator::emptyCache();
    return std::nullopt;
  }
}

// "%.1f" of v * mult, or "n/a".
std::string format_or_na(const std::optional<double>& v, double mult, const char* fmt = "%.1f") {
  if (!v) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, *v * mult);
  return buf;
}

nlohmann::json json_or_null(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// A pool holding `num_seqs` sequences of `ctx` tokens in shuffled blocks, and their tables.
struct Pool {
  at::Tensor kv_cache;      // [num_blocks, 2, kKvHeads, kBlockSize, kHeadDim] bf16
  at::Tensor block_tables;  // [num_seqs, ctx / kBlockSize] int32
};

Pool make_pool(int64_t num_seqs, int64_t ctx) {
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const int64_t blocks_per_seq = (ctx + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = num_seqs * blocks_per_seq;
  Pool pool;
  pool.kv_cache =
      at::empty({num_blocks, 2, kKvHeads, kBlockSize, kHeadDim}, opts.dtype(at::kBFloat16));
  pool.kv_cache.uniform_(-1, 1);
  pool.block_tables = at::randperm(num_blocks, opts.dtype(at::kLong))
                          .to(at::kInt)
                          .view({num_seqs, blocks_per_seq});
  return pool;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<strata::bench::GpuRun> run =
      strata::bench::start_gpu_run(argc, argv, "attention_bench");
  if (!run) return 0;
  const double copy_gbps = run->copy_gbps;
  nlohmann::json& results = run->results;
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  const int64_t elem = 2;  // bf16

  std::printf("decode: %d q heads, %d kv heads, head_dim %d, block %d, bf16\n",
              static_cast<int>(kHeads), static_cast<int>(kKvHeads), static_cast<int>(kHeadDim),
              static_cast<int>(kBlockSize));
  std::printf("%7s %6s %10s %10s %9s %9s\n", "context", "batch", "ours_us", "sdpa_us",
              "vs_sdpa", "vs_copy");
  for (int64_t ctx : {1024, 4096, 16384, 32768}) {
    for (int64_t batch : {1, 8, 32, 128}) {
      const double kv_bytes = 2.0 * batch * ctx * kKvHeads * kHeadDim * elem;
      // The pool with 2 GB to spare; SDPA's contiguous K/V is checked once the pool exists.
      const bool fits_ours = kv_bytes + 2e9 < free_device_bytes();
      if (!fits_ours) {
        std::printf("%7ld %6ld  skipped: %.1f GB of K/V does not fit\n", ctx, batch,
                    kv_bytes / 1e9);
        continue;
      }
      double ours = 0;
      std::optional<double> torch_ms;
      {
        Pool pool = make_pool(batch, ctx);
        const at::Tensor q = at::randn({batch, kHeads, kHeadDim}, opts.dtype(at::kBFloat16));
        const at::Tensor seq_lens = at::full({batch}, ctx, opts.dtype(at::kInt));
        const at::Tensor cu_q_lens = at::arange(batch + 1, opts.dtype(at::kInt));
        ours = time_ms([&] {
          (void)strata::kernels::paged_attention(q, pool.kv_cache, pool.block_tables, seq_lens,
                                                 cu_q_lens, 1, scale);
        });
        if (kv_bytes + 2e9 < free_device_bytes()) {
          // Contiguous [batch, kv_heads, ctx, head_dim] K and V: what SDPA reads.
          const at::Tensor k =
              at::empty({batch, kKvHeads, ctx, kHeadDim}, q.options()).uniform_(-1, 1);
          const at::Tensor v = at::empty_like(k).uniform_(-1, 1);
          const at::Tensor q4 = q.unsqueeze(2);  // [batch, heads, 1, head_dim]
          torch_ms = time_torch([&] {
            (void)at::scaled_dot_product_attention(q4, k, v, {}, 0.0, false, scale,
                                                   /*enable_gqa=*/true);
          });
        }
      }
      c10::cuda::CUDACachingAllocator::emptyCache();
      const double bytes = kv_bytes + 2.0 * batch * kHeads * kHeadDim * elem;
      const double frac = bytes / (ours * 1e6) / copy_gbps;
      std::printf("%7ld %6ld %10.1f %10s %9s %8.0f%%\n", ctx, batch, ours * 1e3,
                  format_or_na(torch_ms, 1e3).c_str(),
                  format_or_na(torch_ms, 1.0 / ours, "%.2fx").c_str(), 100 * frac);
      results["rows"].push_back({{"op", "decode"}, {"context", ctx}, {"batch", batch},
                                 {"bytes", bytes}, {"ours_ms", ours},
                                 {"torch_ms", json_or_null(torch_ms)},
                                 {"fraction_of_copy_bw", frac}});
    }
  }

  // Causal prefill of one sequence: compute-bound; our kernel uses CUDA cores, SDPA tensor cores.
  std::printf("prefill (one sequence, causal)\n%7s %10s %10s %9s %9s\n", "tokens", "ours_us",
              "sdpa_us", "vs_sdpa", "TFLOP/s");
  for (int64_t len : {512, 2048, 8192}) {
    Pool pool = make_pool(1, len);
    const at::Tensor q = at::randn({len, kHeads, kHeadDim}, opts.dtype(at::kBFloat16));
    const at::Tensor seq_lens = at::full({1}, len, opts.dtype(at::kInt));
    const at::Tensor cu_q_lens = at::tensor({0, static_cast<int>(len)}, opts.dtype(at::kInt));
    const double ours = time_ms(
        [&] {
          (void)strata::kernels::paged_attention(q, pool.kv_cache, pool.block_tables, seq_lens,
                                                 cu_q_lens, len, scale);
        },
        5);
    const at::Tensor k = at::empty({1, kKvHeads, len, kHeadDim}, q.options()).uniform_(-1, 1);
    const at::Tensor v = at::empty_like(k).uniform_(-1, 1);
    const at::Tensor q4 = q.transpose(0, 1).unsqueeze(0);  // [1, heads, len, head_dim]
    const std::optional<double> torch_ms = time_torch([&] {
      (void)at::scaled_dot_product_attention(q4, k, v, {}, 0.0, /*is_causal=*/true, scale,
                                             /*enable_gqa=*/true);
    });
    // Two matmuls over the causal half: 2 * 2 * heads * head_dim * len * (len + 1) / 2.
    const double flops = 2.0 * kHeads * kHeadDim * static_cast<double>(len) * (len + 1);
    const double tflops = flops / (ours * 1e9);
    std::printf("%7ld %10.1f %10s %9s %9.1f\n", len, ours * 1e3,
                format_or_na(torch_ms, 1e3).c_str(),
                format_or_na(torch_ms, 1.0 / ours, "%.2fx").c_str(), tflops);
    results["rows"].push_back({{"op", "prefill"}, {"context", len}, {"batch", 1},
                               {"ours_ms", ours}, {"torch_ms", json_or_null(torch_ms)},
                               {"tflops", tflops}});
  }
  strata::bench::finish_gpu_run(*run);
  return 0;
}
