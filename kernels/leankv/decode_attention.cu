// LeanKV's mixed-precision decode attention (contract in ops.h, LeanKvDecodeParams; the libtorch
// reference is kernels::aten::leankv_decode_attention; design in docs/leankv.md).
//
// One thread block per (sequence, KV head) serves all G query heads of the group, so each KV
// byte is read once per group. Three passes over the head's tokens, high pages first, then low
// pages, then the full-precision window (a warp never mixes precisions within one iteration):
//   1. logits: C_k / 16 lanes per key, one 16-byte vector each from the chunked key layout
//      (consecutive lanes read consecutive bytes), integer codes dotted with q in registers and
//      dequantized once per token: q . k^ = scale * (q . codes) + zero * sum(q). Logits go to the
//      workspace; each thread keeps its running max per query head.
//   2. block max and sum of exp per query head; the workspace becomes probabilities.
//   3. values: one warp per token, each lane owning head_dim / 32 consecutive features
//      (dequantized in registers), accumulating p * v per query head; lane 0 adds the token's
//      max-over-the-group probability to its accumulator (the page's scores segment, or the
//      window's). Warps' partial outputs are summed through shared memory.
// No tensor cores: per KV head a decode step has G <= 8 query rows, far below an MMA tile's
// arithmetic intensity break-even, and the kernel is bound by the bytes of KV it reads.

#include <cmath>
#include <cstdint>

#include "../common/dispatch.cuh"
#include "../common/group_softmax.cuh"

namespace strata::kernels {
namespace {

using kv::leankv::PageSegments;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
// Occupancy asked of ptxas: 4 CTAs (16 warps) per SM caps registers at 128 per thread, which the
// kernel fits without spilling (ptxas picks 96 and spills when not asked).
constexpr int kMinBlocksPerSm = 4;

// Byte i (0..15, a compile-time constant after unrolling) of a 16-byte vector.
__device__ __forceinline__ uint32_t byte_of(const uint4& v, int i) {
  const uint32_t word = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return (word >> (8 * (i % 4))) & 0xFFu;
}

__device__ __forceinline__ void read_params(const unsigned char* p, float* scale, float* zero) {
  const __half* h = reinterpret_cast<const __half*>(p);
  *scale = __half2float(h[0]);
  *zero = __half2float(h[1]);
}

// Where token i of a section lies: its page (from the table's left end for high tokens, the
// right end for low ones) and slot.
__device__ __forceinline__ unsigned char* token_page(const LeanKvDecodeParams& p,
                                                     const int32_t* table, const PageSegments& seg,
                                                     bool low, int i, int* slot) {
  const int page_index = i / seg.tokens;
  *slot = i - page_index * seg.tokens;
  const int32_t page = table[low ? p.table_width - 1 - page_index : page_index];
  return p.pool + static_cast<int64_t>(page) * p.page_bytes;
}

struct Shared {
  float q[kMaxGroup][128];
  float q_sum[kMaxGroup];
  float reduce[kWarps][kMaxGroup];
  float stat[2][kMaxGroup];  // [0]: max, [1]: 1 / sum of exp
};

// Pass 1 over one quantized section: logits of its n tokens into logits[g * max_tokens + base + i].
template <int BITS, int D>
__device__ __forceinline__ void section_logits(const LeanKvDecodeParams& p, const Shared& sh,
                                               const int32_t* table, const PageSegments& seg,
                                               bool low, int n, int base, int group, float* logits,
                                               float (&running_max)[kMaxGroup]) {
  constexpr int kRowBytes = D * BITS / 8;
  constexpr int kChunk = kRowBytes < 64 ? kRowBytes : 64;
  constexpr int kChunks = kRowBytes / kChunk;
  constexpr int kLanesPerToken = kChunk / 16;
  constexpr int kTokensPerIter = 32 / kLanesPerToken;
  constexpr int kPerByte = 8 / BITS;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane % kLanesPerToken;
  for (int first = warp * kTokensPerIter; first < n; first += kWarps * kTokensPerIter) {
    const int i = first + lane / kLanesPerToken;
    float dot[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) dot[g] = 0.0f;
    float scale = 0.0f, zero = 0.0f;
    if (i < n) {
      int slot;
      const unsigned char* page = token_page(p, table, seg, low, i, &slot);
#pragma unroll 1
      for (int c = 0; c < kChunks; ++c) {
        const uint4 v = *reinterpret_cast<const uint4*>(
            page + seg.key_data + (static_cast<int64_t>(c) * seg.tokens + slot) * kChunk +
            sub * 16);
        const int f0 = (c * kChunk + sub * 16) * kPerByte;
#pragma unroll
        for (int b = 0; b < 16; ++b) {
          const uint32_t byte = byte_of(v, b);
#pragma unroll
          for (int k = 0; k < kPerByte; ++k) {
            const float code = static_cast<float>((byte >> (k * BITS)) & ((1u << BITS) - 1));
#pragma unroll
            for (int g = 0; g < kMaxGroup; ++g) {
              if (g < group) dot[g] = fmaf(sh.q[g][f0 + b * kPerByte + k], code, dot[g]);
            }
          }
        }
      }
      read_params(page + seg.key_params + 4 * slot, &scale, &zero);
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
      for (int offset = kLanesPerToken / 2; offset > 0; offset /= 2) {
        dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], offset);
      }
    }
    if (i < n && sub == 0) {
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          const float logit = (scale * dot[g] + zero * sh.q_sum[g]) * p.scale;
          logits[g * p.max_tokens + base + i] = logit;
          running_max[g] = fmaxf(running_max[g], logit);
        }
      }
    }
  }
}

template <int D>
__device__ __forceinline__ void section_logits_bits(int bits, const LeanKvDecodeParams& p,
                                                    const Shared& sh, const int32_t* table,
                                                    const PageSegments& seg, bool low, int n,
                                                    int base, int group, float* logits,
                                                    float (&running_max)[kMaxGroup]) {
  if (bits == 8) section_logits<8, D>(p, sh, table, seg, low, n, base, group, logits, running_max);
  if (bits == 4) section_logits<4, D>(p, sh, table, seg, low, n, base, group, logits, running_max);
  if (bits == 2) section_logits<2, D>(p, sh, table, seg, low, n, base, group, logits, running_max);
}

// Pass 3 over one quantized section: out[g][j] += p_g * v^[lane * D / 32 + j].
template <int BITS, int D>
__device__ __forceinline__ void section_values(const LeanKvDecodeParams& p, const int32_t* table,
                                               const PageSegments& seg, bool low, int n, int base,
                                               int group, const float* probs,
                                               float (&out)[kMaxGroup][D / 32]) {
  constexpr int kFeatures = D / 32;            // per lane, consecutive
  constexpr int kLaneBits = kFeatures * BITS;  // 4 .. 32
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t bit0 = static_cast<int64_t>(lane) * kLaneBits;  // in the token's row
  const int row_byte = static_cast<int>(bit0 / 8);
  constexpr int kRowBytes = D * BITS / 8;
  constexpr int kChunk = kRowBytes < 64 ? kRowBytes : 64;
  const int chunk = row_byte / kChunk, in_chunk = row_byte % kChunk;
  for (int i = warp; i < n; i += kWarps) {
    int slot;
    unsigned char* page = token_page(p, table, seg, low, i, &slot);
    const unsigned char* bytes = page + seg.value_data +
                                 (static_cast<int64_t>(chunk) * seg.tokens + slot) * kChunk +
                                 in_chunk;
    uint32_t codes;
    if constexpr (kLaneBits == 32) {
      codes = *reinterpret_cast<const uint32_t*>(bytes);
    } else if constexpr (kLaneBits == 16) {
      codes = *reinterpret_cast<const uint16_t*>(bytes);
    } else if constexpr (kLaneBits == 8) {
      codes = *bytes;
    } else {
      codes = (*bytes >> (bit0 % 8)) & 0xFu;
    }
    float scale, zero;
    read_params(page + seg.value_params + 4 * slot, &scale, &zero);
    float most = 0.0f;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        const float pg = probs[g * p.max_tokens + base + i];
        most = fmaxf(most, pg);
#pragma unroll
        for (int j = 0; j < kFeatures; ++j) {
          const float v =
              fmaf(scale, static_cast<float>((codes >> (j * BITS)) & ((1u << BITS) - 1)), zero);
          out[g][j] = fmaf(pg, v, out[g][j]);
        }
      }
    }
    if (lane == 0) *reinterpret_cast<float*>(page + seg.scores + 4 * slot) += most;
  }
}

template <int D>
__device__ __forceinline__ void section_values_bits(int bits, const LeanKvDecodeParams& p,
                                                    const int32_t* table, const PageSegments& seg,
                                                    bool low, int n, int base, int group,
                                                    const float* probs,
                                                    float (&out)[kMaxGroup][D / 32]) {
  if (bits == 8) section_values<8, D>(p, table, seg, low, n, base, group, probs, out);
  if (bits == 4) section_values<4, D>(p, table, seg, low, n, base, group, probs, out);
  if (bits == 2) section_values<2, D>(p, table, seg, low, n, base, group, probs, out);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    leankv_decode_attention_kernel(const LeanKvDecodeParams p) {
  __shared__ Shared sh;
  const int h = blockIdx.x, s = blockIdx.y;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const T* q = static_cast<const T*>(p.q) + (static_cast<int64_t>(s) * p.num_heads + h * group) * D;
  for (int i = tid; i < group * D; i += kThreads) sh.q[i / D][i % D] = to_float(q[i]);
  __syncthreads();
  if (tid < group) {
    float sum = 0.0f;
    for (int f = 0; f < D; ++f) sum += sh.q[tid][f];
    sh.q_sum[tid] = sum;
  }
  __syncthreads();

  const int32_t entry = p.entries[static_cast<int64_t>(s) * p.num_kv_heads + h];
  const int32_t* table = p.tables + static_cast<int64_t>(entry) * p.table_width;
  const int n_high = p.token_counts[2 * static_cast<int64_t>(entry)];
  const int n_low = p.token_counts[2 * static_cast<int64_t>(entry) + 1];
  const int n_window = p.window_lens[s];
  const int total = n_high + n_low + n_window;
  float* logits =
      p.workspace + (static_cast<int64_t>(s) * p.num_kv_heads + h) * group * p.max_tokens;
  const int64_t window_stride = p.window_capacity * D;  // one K or V head
  const T* window_k = static_cast<const T*>(p.window) +
                      ((static_cast<int64_t>(s) * 2 + 0) * p.num_kv_heads + h) * window_stride;
  const T* window_v = static_cast<const T*>(p.window) +
                      ((static_cast<int64_t>(s) * 2 + 1) * p.num_kv_heads + h) * window_stride;
  float* window_acc =
      p.window_acc + (static_cast<int64_t>(s) * p.num_kv_heads + h) * p.window_capacity;

  // 1. Logits.
  float running_max[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) running_max[g] = -INFINITY;
  section_logits_bits<D>(p.high_bits.key, p, sh, table, p.high, false, n_high, 0, group, logits,
                         running_max);
  section_logits_bits<D>(p.low_bits.key, p, sh, table, p.low, true, n_low, n_high, group, logits,
                         running_max);
  for (int i = tid; i < n_window; i += kThreads) {
    float dot[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) dot[g] = 0.0f;
    for (int f = 0; f < D; ++f) {
      const float k = to_float(window_k[static_cast<int64_t>(i) * D + f]);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) dot[g] = fmaf(sh.q[g < group ? g : 0][f], k, dot[g]);
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        const float logit = dot[g] * p.scale;
        logits[g * p.max_tokens + n_high + n_low + i] = logit;
        running_max[g] = fmaxf(running_max[g], logit);
      }
    }
  }

  // 2. Softmax statistics; logits become probabilities.
  group_softmax<kMaxGroup, kWarps>(logits, p.max_tokens, total, group, running_max, sh.reduce,
                                   sh.stat);

  // 3. Values and accumulators.
  float out[kMaxGroup][D / 32];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int j = 0; j < D / 32; ++j) out[g][j] = 0.0f;
  }
  section_values_bits<D>(p.high_bits.value, p, table, p.high, false, n_high, 0, group, logits, out);
  section_values_bits<D>(p.low_bits.value, p, table, p.low, true, n_low, n_high, group, logits,
                         out);
  for (int i = warp; i < n_window; i += kWarps) {
    float most = 0.0f;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        const float pg = logits[g * p.max_tokens + n_high + n_low + i];
        most = fmaxf(most, pg);
#pragma unroll
        for (int j = 0; j < D / 32; ++j) {
          const float v = to_float(window_v[static_cast<int64_t>(i) * D + lane * (D / 32) + j]);
          out[g][j] = fmaf(pg, v, out[g][j]);
        }
      }
    }
    if (lane == 0) window_acc[i] += most;
  }
  // Warps' partial outputs, through shared memory (the q buffer is free now).
  T* result = static_cast<T*>(p.out) + (static_cast<int64_t>(s) * p.num_heads + h * group) * D;
  for (int w = 0; w < kWarps; ++w) {
    __syncthreads();
    if (warp == w) {
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
        for (int j = 0; j < D / 32; ++j) {
          if (g < group)
            sh.q[g][lane * (D / 32) + j] =
                (w == 0 ? 0.0f : sh.q[g][lane * (D / 32) + j]) + out[g][j];
        }
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < group * D; i += kThreads) result[i] = from_float<T>(sh.q[i / D][i % D]);
}

}  // namespace

size_t leankv_decode_workspace_bytes(const LeanKvDecodeParams& params) {
  return static_cast<size_t>(params.num_seqs * params.num_heads * params.max_tokens) *
         sizeof(float);
}

void launch_leankv_decode_attention(const LeanKvDecodeParams& params, cudaStream_t stream) {
  if (params.num_seqs == 0) return;
  check_query_groups("LeanKV decode", params.num_heads, params.num_kv_heads, kMaxGroup);
  const dim3 grid(static_cast<unsigned>(params.num_kv_heads),
                  static_cast<unsigned>(params.num_seqs));
  STRATA_DISPATCH_HALF_SCALAR(params.kind, [&] {
    STRATA_DISPATCH_HEAD_DIM(params.head_dim, [&] {
      launch_kernel(leankv_decode_attention_kernel<scalar_t, HEAD_DIM>, {grid, kThreads, 0, stream},
                    params);
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
