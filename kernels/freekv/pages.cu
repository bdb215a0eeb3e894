// FreeKV's hybrid layouts (contracts in ops.h, FreeKvOffloadParams and FreeKvRecallParams;
// design in docs/freekv.md): the device reads keys and values token-major (NHD, the attention's
// layout), the host pool keeps them head-major (HND: one (page, head) is one contiguous block of
// 2 x p x d elements, so a recall moves few large blocks instead of p small rows). The two
// conversions run on the device, as the paper has them:
//   offload  a page leaving the window, NHD -> HND into a staging page the caller copies down in
//            one transfer, with its per-channel min/max key summary (which stays on the device);
//            one thread block per KV head, a thread per channel (coalesced rows).
//   recall   selected (page, head) blocks, as copied up into a staging buffer, HND -> NHD into a
//            recall buffer's slots; or, for a page the other buffer already holds, a copy from
//            it (the delta recall). One thread block per item, 16-byte vectors, any element type.
// Both are pure copies, so offload then recall restores a page bit for bit.

#include <cmath>
#include <cstdint>

#include "../common/dispatch.cuh"

namespace strata::kernels {
namespace {

constexpr int kOffloadThreads = 128;
constexpr int kRecallThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kOffloadThreads)
    freekv_offload_kernel(const FreeKvOffloadParams p) {
  const int64_t m = blockIdx.x, heads = p.num_kv_heads, d = p.head_dim, tokens = p.page_tokens;
  const T* rows_k = static_cast<const T*>(p.rows_k);
  const T* rows_v = static_cast<const T*>(p.rows_v);
  T* page_k = static_cast<T*>(p.page) + m * 2 * tokens * d;  // [n_kv, 2, p, d]: K then V
  T* page_v = page_k + tokens * d;
  for (int64_t c = threadIdx.x; c < d; c += kOffloadThreads) {
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t t = 0; t < tokens; ++t) {
      const T k = rows_k[(t * heads + m) * d + c];
      page_k[t * d + c] = k;
      page_v[t * d + c] = rows_v[(t * heads + m) * d + c];
      lo = fminf(lo, to_float(k));
      hi = fmaxf(hi, to_float(k));
    }
    // Exact: the extremes are elements of T.
    static_cast<T*>(p.kmin)[m * d + c] = from_float<T>(lo);
    static_cast<T*>(p.kmax)[m * d + c] = from_float<T>(hi);
  }
}

__global__ void __launch_bounds__(kRecallThreads) freekv_recall_kernel(const FreeKvRecallParams p) {
  const int32_t* item = p.items + 3 * static_cast<int64_t>(blockIdx.x);
  const int64_t m = item[0], slot = item[1], source = item[2];
  const int64_t tokens = p.page_tokens, vectors = p.row_bytes / 16;  // per token row
  const int64_t token_stride = p.num_kv_heads * vectors;             // NHD, in vectors
  uint4* cache_k = static_cast<uint4*>(p.cache_k) + slot * tokens * token_stride + m * vectors;
  uint4* cache_v = static_cast<uint4*>(p.cache_v) + slot * tokens * token_stride + m * vectors;
  const uint4 *src_k, *src_v;
  int64_t src_stride;
  if (source >= 0) {  // HND chunk [2, p, d]: rows one after another
    src_k = static_cast<const uint4*>(p.chunks) + source * 2 * tokens * vectors;
    src_v = src_k + tokens * vectors;
    src_stride = vectors;
  } else {  // the other recall buffer, NHD
    const int64_t from_slot = -source - 1;
    src_k = static_cast<const uint4*>(p.from_k) + from_slot * tokens * token_stride + m * vectors;
    src_v = static_cast<const uint4*>(p.from_v) + from_slot * tokens * token_stride + m * vectors;
    src_stride = token_stride;
  }
  for (int64_t e = threadIdx.x; e < tokens * vectors; e += kRecallThreads) {
    const int64_t t = e / vectors, x = e % vectors;
    cache_k[t * token_stride + x] = src_k[t * src_stride + x];
    cache_v[t * token_stride + x] = src_v[t * src_stride + x];
  }
}

}  // namespace

void launch_freekv_offload(const FreeKvOffloadParams& params, cudaStream_t stream) {
  if (params.num_kv_heads == 0 || params.page_tokens == 0) return;
  STRATA_DISPATCH_SCALAR(params.kind, [&] {
    launch_kernel(freekv_offload_kernel<scalar_t>,
                  {static_cast<unsigned>(params.num_kv_heads), kOffloadThreads, 0, stream}, params);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_freekv_recall(const FreeKvRecallParams& params, cudaStream_t stream) {
  if (params.num_items == 0) return;
  if (params.row_bytes % 16 != 0) {
    std::fprintf(stderr, "%s:%d: FreeKV recall: rows of %lld bytes (a multiple of 16 needed)\n",
                 __FILE__, __LINE__, static_cast<long long>(params.row_bytes));
    std::abort();
  }
  launch_kernel(freekv_recall_kernel,
                {static_cast<unsigned>(params.num_items), kRecallThreads, 0, stream}, params);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
