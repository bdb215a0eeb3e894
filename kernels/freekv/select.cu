// FreeKV's group-consistent page selection (contract in ops.h, FreeKvSelectParams; the libtorch
// reference is kernels::aten::freekv_select; design in docs/freekv.md).
//
// One thread block per KV head, in three steps:
//   1. bounds: a thread per page (strided) computes the Quest bound of each of the group's G query
//      heads from the page's min/max key row (q in shared memory): sum_c max(q_c hi_c, q_c lo_c)
//      = q+ . kmax + q- . kmin, times the scale, into the workspace [n_kv, G, pages].
//   2. a softmax over pages per query head (group_softmax), then each page's score, the mean of
//      its G probabilities, into `scores`.
//   3. top-k: the k-th largest score by a radix search over its float bits (scores are
//      non-negative, so their bit patterns order like their values), 32 rounds of a block-wide
//      count; then the pages above it and the first of those equal to it (ties to the lower page)
//      are written in ascending order, positions from a block-wide prefix sum.
// The pages of one step are few (a 32K context has 1,024 of 32 tokens) and each is read once: the
// kernel is small beside the attention, and a single block per head needs no grid-wide top-k.

#include <cmath>
#include <cstdint>

#include "../common/dispatch.cuh"
#include "../common/group_softmax.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;

struct Shared {
  float q[kMaxGroup][128];
  float reduce[kWarps][kMaxGroup];
  float stat[2][kMaxGroup];
};

// Number of pages among the block's whose score bits satisfy `pred`, in every thread.
template <typename Pred>
__device__ __forceinline__ long long block_count(const float* scores, int64_t pages, Pred pred) {
  long long mine = 0;
  for (int64_t j = threadIdx.x; j < pages; j += kThreads) mine += pred(__float_as_uint(scores[j]));
  long long total = 0;
  block_exclusive_scan(mine, &total);
  return total;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) freekv_select_kernel(const FreeKvSelectParams p) {
  __shared__ Shared sh;
  const int m = blockIdx.x;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t pages = p.num_pages;
  const T* q = static_cast<const T*>(p.q) + static_cast<int64_t>(m) * group * D;
  for (int i = tid; i < group * D; i += kThreads) sh.q[i / D][i % D] = to_float(q[i]);
  __syncthreads();

  // 1. Bounds.
  float* bounds = p.workspace + static_cast<int64_t>(m) * group * pages;
  const T* kmin = static_cast<const T*>(p.kmin);
  const T* kmax = static_cast<const T*>(p.kmax);
  float running_max[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) running_max[g] = -INFINITY;
  for (int64_t j = tid; j < pages; j += kThreads) {
    const int64_t row = (j * p.num_kv_heads + m) * D;
    float dot[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) dot[g] = 0.0f;
    for (int c = 0; c < D; ++c) {
      const float lo = to_float(kmin[row + c]), hi = to_float(kmax[row + c]);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        const float qc = sh.q[g < group ? g : 0][c];
        dot[g] = fmaf(qc, qc > 0.0f ? hi : lo, dot[g]);
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        const float bound = dot[g] * p.scale;
        bounds[g * pages + j] = bound;
        running_max[g] = fmaxf(running_max[g], bound);
      }
    }
  }

  // 2. Probabilities per query head, the group's mean per page.
  group_softmax<kMaxGroup, kWarps>(bounds, pages, static_cast<int>(pages), group, running_max,
                                   sh.reduce, sh.stat);
  float* scores = p.scores + static_cast<int64_t>(m) * pages;
  for (int64_t j = tid; j < pages; j += kThreads) {
    float sum = 0.0f;
    for (int g = 0; g < group; ++g) sum += bounds[g * pages + j];
    scores[j] = sum / static_cast<float>(group);
  }

  // 3. The k-th largest score's bits, then the selection in page order. Each thread reads only
  // the scores it wrote (page j belongs to thread j % kThreads throughout): no barrier needed.
  const long long k = p.top_k;
  unsigned threshold = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const unsigned candidate = threshold | (1u << bit);
    if (block_count(scores, pages, [&](unsigned b) { return b >= candidate; }) >= k) {
      threshold = candidate;
    }
  }
  const long long above = block_count(scores, pages, [&](unsigned b) { return b > threshold; });
  const long long ties_taken = k - above;  // >= 1: the threshold is some page's score
  int64_t* selected = p.selected + static_cast<int64_t>(m) * k;
  long long ties_before = 0, taken_before = 0;
  for (int64_t base = 0; base < pages; base += kThreads) {
    const int64_t j = base + tid;
    const unsigned b = j < pages ? __float_as_uint(scores[j]) : 0u;
    const long long tie = j < pages && b == threshold ? 1 : 0;
    long long ties = 0, taken = 0;
    const long long tie_rank = ties_before + block_exclusive_scan(tie, &ties);
    const long long take = (j < pages && b > threshold) || (tie && tie_rank < ties_taken) ? 1 : 0;
    const long long at = taken_before + block_exclusive_scan(take, &taken);
    if (take) selected[at] = j;
    ties_before += ties;
    taken_before += taken;
  }
}

}  // namespace

size_t freekv_select_workspace_bytes(const FreeKvSelectParams& params) {
  return static_cast<size_t>(params.num_heads * params.num_pages) * sizeof(float);
}

void launch_freekv_select(const FreeKvSelectParams& params, cudaStream_t stream) {
  if (params.num_kv_heads == 0 || params.num_pages == 0) return;
  check_query_groups("FreeKV select", params.num_heads, params.num_kv_heads, kMaxGroup);
  if (params.top_k < 1 || params.top_k > params.num_pages) {
    std::fprintf(stderr, "%s:%d: FreeKV select: top %lld of %lld pages\n", __FILE__, __LINE__,
                 static_cast<long long>(params.top_k), static_cast<long long>(params.num_pages));
    std::abort();
  }
  STRATA_DISPATCH_HALF_SCALAR(params.kind, [&] {
    STRATA_DISPATCH_HEAD_DIM(params.head_dim, [&] {
      launch_kernel(freekv_select_kernel<scalar_t, HEAD_DIM>,
                    {static_cast<unsigned>(params.num_kv_heads), kThreads, 0, stream}, params);
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
