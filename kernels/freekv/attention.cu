// FreeKV's decode attention (contract in ops.h, FreeKvAttentionParams; the libtorch reference is
// kernels::aten::freekv_attention; design in docs/freekv.md): one query token of one sequence
// over, per KV head, the resident tokens (sink and window) and the pages recalled into the
// head's slots of a recall buffer, both token-major (NHD) as the recall kernel leaves them.
//
// One thread block per KV head serves all G query heads of its group, so each key and value is
// read once per group. Three passes over the head's tokens (resident first, then the slots):
//   1. logits: D * sizeof(T) / 16 lanes per key, one 16-byte vector each (a key row is read by
//      consecutive lanes), dotted with the G queries in registers, reduced over the lanes with
//      shuffles; into the workspace [n_kv, G, max_tokens], with a running max per query head.
//   2. the softmax per query head (group_softmax).
//   3. values: one warp per token, each lane owning D / 32 consecutive features, accumulating
//      p * v per query head; the warps' partial outputs are summed through shared memory.
// No tensor cores: G <= 8 query rows per KV head is far below an MMA tile's break-even, and the
// kernel is bound by the bytes of KV it reads (as LeanKV's decode kernel).

#include <cmath>
#include <cstdint>

#include "../common/dispatch.cuh"
#include "../common/group_softmax.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;

struct Shared {
  float q[kMaxGroup][128];
  float reduce[kWarps][kMaxGroup];
  float stat[2][kMaxGroup];
};

// Token i of KV head m: resident row i, then slot (i - t) / p, token (i - t) % p of the cache.
template <typename T, int D>
__device__ __forceinline__ const T* token_row(const FreeKvAttentionParams& p, const T* resident,
                                              const T* cache, int64_t i, int64_t m) {
  if (i < p.resident_tokens) return resident + (i * p.num_kv_heads + m) * D;
  const int64_t c = i - p.resident_tokens;
  return cache + (c * p.num_kv_heads + m) * D;  // [slot, p, n_kv, D]: slot * p + token = c
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) freekv_attention_kernel(const FreeKvAttentionParams p) {
  __shared__ Shared sh;
  const int64_t m = blockIdx.x;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const T* q = static_cast<const T*>(p.q) + m * group * D;
  for (int i = tid; i < group * D; i += kThreads) sh.q[i / D][i % D] = to_float(q[i]);
  __syncthreads();

  const int64_t max_tokens = p.resident_tokens + p.capacity * p.page_tokens;
  const int total = static_cast<int>(p.resident_tokens + p.slots[m] * p.page_tokens);
  float* logits = p.workspace + m * group * max_tokens;
  const T* resident_k = static_cast<const T*>(p.resident_k);
  const T* cache_k = static_cast<const T*>(p.cache_k);

  // 1. Logits.
  constexpr int kPerVector = 16 / sizeof(T);
  constexpr int kLanesPerToken = D / kPerVector;  // 4 .. 16
  constexpr int kTokensPerIter = 32 / kLanesPerToken;
  const int sub = lane % kLanesPerToken;
  float running_max[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) running_max[g] = -INFINITY;
  for (int first = warp * kTokensPerIter; first < total; first += kWarps * kTokensPerIter) {
    const int i = first + lane / kLanesPerToken;
    float dot[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) dot[g] = 0.0f;
    if (i < total) {
      const uint4 v = *reinterpret_cast<const uint4*>(
          token_row<T, D>(p, resident_k, cache_k, i, m) + sub * kPerVector);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int b = 0; b < kPerVector; ++b) {
        const float k = to_float(e[b]);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < group) dot[g] = fmaf(sh.q[g][sub * kPerVector + b], k, dot[g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
      for (int offset = kLanesPerToken / 2; offset > 0; offset /= 2) {
        dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], offset);
      }
    }
    if (i < total && sub == 0) {
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          const float logit = dot[g] * p.scale;
          logits[g * max_tokens + i] = logit;
          running_max[g] = fmaxf(running_max[g], logit);
        }
      }
    }
  }

  // 2. Probabilities.
  group_softmax<kMaxGroup, kWarps>(logits, max_tokens, total, group, running_max, sh.reduce,
                                   sh.stat);

  // 3. Values.
  constexpr int kFeatures = D / 32;
  const T* resident_v = static_cast<const T*>(p.resident_v);
  const T* cache_v = static_cast<const T*>(p.cache_v);
  float out[kMaxGroup][kFeatures];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int j = 0; j < kFeatures; ++j) out[g][j] = 0.0f;
  }
  for (int i = warp; i < total; i += kWarps) {
    const T* row = token_row<T, D>(p, resident_v, cache_v, i, m) + lane * kFeatures;
    float v[kFeatures];
#pragma unroll
    for (int j = 0; j < kFeatures; ++j) v[j] = to_float(row[j]);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        const float pg = logits[g * max_tokens + i];
#pragma unroll
        for (int j = 0; j < kFeatures; ++j) out[g][j] = fmaf(pg, v[j], out[g][j]);
      }
    }
  }
  // Warps' partial outputs, through shared memory (the q buffer is free now).
  T* result = static_cast<T*>(p.out) + m * group * D;
  for (int w = 0; w < kWarps; ++w) {
    __syncthreads();
    if (warp == w) {
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
        for (int j = 0; j < kFeatures; ++j) {
          if (g < group)
            sh.q[g][lane * kFeatures + j] =
                (w == 0 ? 0.0f : sh.q[g][lane * kFeatures + j]) + out[g][j];
        }
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < group * D; i += kThreads) result[i] = from_float<T>(sh.q[i / D][i % D]);
}

}  // namespace

size_t freekv_attention_workspace_bytes(const FreeKvAttentionParams& params) {
  return static_cast<size_t>(params.num_heads *
                             (params.resident_tokens + params.capacity * params.page_tokens)) *
         sizeof(float);
}

void launch_freekv_attention(const FreeKvAttentionParams& params, cudaStream_t stream) {
  if (params.num_kv_heads == 0) return;
  check_query_groups("FreeKV attention", params.num_heads, params.num_kv_heads, kMaxGroup);
  STRATA_DISPATCH_HALF_SCALAR(params.kind, [&] {
    STRATA_DISPATCH_HEAD_DIM(params.head_dim, [&] {
      launch_kernel(freekv_attention_kernel<scalar_t, HEAD_DIM>,
                    {static_cast<unsigned>(params.num_kv_heads), kThreads, 0, stream}, params);
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
