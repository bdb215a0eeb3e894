// GPU benchmark of LeanKV's mixed-precision decode attention (kernels/leankv/decode_attention.cu)
// against Strata's bf16 paged attention on the same contexts (the figure: K8V4 decode
// time against the bf16 kernel at 4K..32K, goal >= 1.8x), with each kernel's effective bandwidth
// (the bytes it must read) as a share of the device-to-device copy bandwidth measured in the same
// run. Shapes: Llama-3-8B attention (32 q heads, 8 KV heads, head_dim 128), batch 8, a 64-token
// bf16 window; LeanKV pages all high (K8V4), and a mix of 40% high / 50% low (K4V2) / 10% pruned.
// Page contents are random bytes (timing does not depend on values); pages are shuffled.
//
// usage: leankv_attention_bench [--json PATH]   (exits 0 with a note when no CUDA device is
// present)

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "gpu_timing.h"
#include "launch_params.h"
#include "strata/kernels/ops.h"
#include "strata/kernels/torch_ops.h"
#include "strata/kv/leankv_page_format.h"

namespace {

using strata::bench::time_ms;
namespace leankv = strata::kv::leankv;

constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16, kBatch = 8;
constexpr int64_t kWindow = 64;

// LeanKV state for kBatch sequences of `high` + `low` stored tokens per KV head.
struct LeanState {
  at::Tensor pool, tables, token_counts, entries, window, window_lens, window_acc;
  int64_t max_tokens = 0;
  double bytes = 0;  // K/V data and params, accumulators read and written back, the window
};

LeanState make_lean(const leankv::PageFormat& f, int64_t high, int64_t low) {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const int64_t th = f.tokens_per_page(leankv::Precision::kHigh);
  const int64_t tl = f.tokens_per_page(leankv::Precision::kLow);
  const int64_t high_pages = (high + th - 1) / th, low_pages = (low + tl - 1) / tl;
  const int64_t entries = kBatch * kKvHeads, width = high_pages + low_pages + 2;
  const int64_t num_pages = entries * (high_pages + low_pages);
  LeanState s;
  s.pool =
      at::randint(0, 256, {std::max<int64_t>(num_pages, 1), f.page_bytes()}, cuda.dtype(at::kByte));
  const at::Tensor order = at::randperm(std::max<int64_t>(num_pages, 1), at::kInt);
  s.tables = at::full({entries, width}, -1, at::kInt);
  int64_t next = 0;
  for (int64_t e = 0; e < entries; ++e) {
    for (int64_t i = 0; i < high_pages; ++i) s.tables[e][i] = order[next++];
    for (int64_t j = 0; j < low_pages; ++j) s.tables[e][width - 1 - j] = order[next++];
  }
  s.tables = s.tables.to(at::kCUDA);
  s.token_counts =
      at::tensor(std::vector<int32_t>{static_cast<int32_t>(high), static_cast<int32_t>(low)})
          .repeat({entries, 1})
          .to(at::kCUDA);
  s.entries = at::arange(entries, cuda.dtype(at::kInt)).view({kBatch, kKvHeads});
  s.window = at::randn({kBatch, 2, kKvHeads, kWindow + 1, kHeadDim}, cuda.dtype(at::kBFloat16));
  s.window_lens = at::full({kBatch}, kWindow + 1, cuda.dtype(at::kInt));
  s.window_acc = at::zeros({kBatch, kKvHeads, kWindow + 1}, cuda.dtype(at::kFloat));
  s.max_tokens = high + low + kWindow + 1;
  // token_bytes: data, params, accumulator and position; the position is not read, the
  // accumulator is read and written: the same count.
  const double per_head = high * f.token_bytes(leankv::Precision::kHigh) +
                          low * f.token_bytes(leankv::Precision::kLow) +
                          (kWindow + 1) * 2.0 * kHeadDim * 2;
  s.bytes = kBatch * kKvHeads * per_head;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<strata::bench::GpuRun> run =
      strata::bench::start_gpu_run(argc, argv, "leankv_attention_bench");
  if (!run) return 0;
  const double copy_gbps = run->copy_gbps;
  nlohmann::json& results = run->results;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  const leankv::PageFormat format =
      leankv::PageFormat::create(kHeadDim, {8, 4}, {4, 2}, 32).value();
  std::printf("%7s %-10s %10s %10s %9s %9s %9s\n", "context", "mix", "bf16_us", "leankv_us",
              "speedup", "bf16_bw", "lean_bw");
  for (int64_t ctx : {4096, 8192, 16384, 32768}) {
    // bf16 paged attention over the whole context.
    const int64_t blocks_per_seq = ctx / kBlockSize, num_blocks = kBatch * blocks_per_seq;
    const at::Tensor kv =
        at::empty({num_blocks, 2, kKvHeads, kBlockSize, kHeadDim}, cuda.dtype(at::kBFloat16))
            .uniform_(-1, 1);
    const at::Tensor tables =
        at::randperm(num_blocks, cuda.dtype(at::kLong)).to(at::kInt).view({kBatch, blocks_per_seq});
    const at::Tensor q = at::randn({kBatch, kHeads, kHeadDim}, cuda.dtype(at::kBFloat16));
    const at::Tensor seq_lens = at::full({kBatch}, ctx, cuda.dtype(at::kInt));
    const at::Tensor cu_q_lens = at::arange(kBatch + 1, cuda.dtype(at::kInt));
    const double bf16_ms = time_ms([&] {
      (void)strata::kernels::paged_attention(q, kv, tables, seq_lens, cu_q_lens, 1, scale);
    });
    const double bf16_bytes = 2.0 * kBatch * ctx * kKvHeads * kHeadDim * 2;
    const int64_t stored = ctx - kWindow - 1;
    for (const auto& [mix, high, low] :
         {std::tuple<const char*, int64_t, int64_t>{"all-high", stored, 0},
          {"40/50/10", stored * 4 / 10, stored * 5 / 10}}) {
      LeanState s = make_lean(format, high, low);
      at::Tensor out = at::empty_like(q);
      strata::kernels::LeanKvDecodeParams params = strata::kernels::leankv_decode_params(
          out, q, s.pool, format, s.tables, s.token_counts, s.entries, s.window, s.window_lens,
          s.window_acc, s.max_tokens, scale);
      const at::Tensor workspace =
          at::empty({static_cast<int64_t>(strata::kernels::leankv_decode_workspace_bytes(params))},
                    cuda.dtype(at::kByte));
      params.workspace = reinterpret_cast<float*>(workspace.data_ptr());
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
      const double lean_ms =
          time_ms([&] { strata::kernels::launch_leankv_decode_attention(params, stream); });
      const double bf16_bw = bf16_bytes / (bf16_ms * 1e6) / copy_gbps;
      const double lean_bw = s.bytes / (lean_ms * 1e6) / copy_gbps;
      std::printf("%7ld %-10s %10.1f %10.1f %8.2fx %8.0f%% %8.0f%%\n", ctx, mix, bf16_ms * 1e3,
                  lean_ms * 1e3, bf16_ms / lean_ms, 100 * bf16_bw, 100 * lean_bw);
      results["rows"].push_back({{"context", ctx},
                                 {"mix", mix},
                                 {"batch", kBatch},
                                 {"bf16_ms", bf16_ms},
                                 {"leankv_ms", lean_ms},
                                 {"speedup", bf16_ms / lean_ms},
                                 {"bf16_bytes", bf16_bytes},
                                 {"leankv_bytes", s.bytes},
                                 {"bf16_fraction_of_copy_bw", bf16_bw},
                                 {"leankv_fraction_of_copy_bw", lean_bw}});
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  strata::bench::finish_gpu_run(*run);
  return 0;
}
