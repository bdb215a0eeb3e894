// Paged attention over the KV pool: one kernel for decode, chunked prefill and prefill (CUDA
// cores, fp32 accumulation), and a split-K reduction. Design, tiling and limits are described in
// docs/kernels/paged-attention.md; the contract is in include/strata/kernels/ops.h.
//
// Work decomposition. For one (sequence s, kv head), the query *rows* are the pairs
// (query token i, query head g of the kv head's group), numbered r = i * G + g; a CTA takes a
// tile of kRows consecutive rows, so the K/V it streams are read once for all of them (for
// decode: once per kv head for the whole GQA group). The grid is
//   x: work item (sequence, row tile)   y: kv head   z: split of the context (split-K).
// A CTA streams the keys [split * P, min((split + 1) * P, last row position + 1)) of its
// sequence through shared memory, kTileTokens at a time (cp.async, double-buffered), with an
// online softmax per warp; the 4 warps and the splits are merged at the end (the splits by
// paged_attention_reduce_kernel through the workspace).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "../common/dispatch.cuh"
#include "../common/ptx.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 8;                            // query rows per CTA
constexpr int kTileTokens = 64;                     // keys per pipeline stage
constexpr int kKeysPerWarp = kTileTokens / kWarps;  // each warp owns 16 keys of a tile
constexpr int kStages = 2;
// CTAs per SM asked of ptxas (__launch_bounds__). head_dim 64: 3 (~37 KB of shared memory each;
// registers capped at 168, which the variant fits). head_dim 128: 2, because at 3 ptxas spills
// (168 registers, 8-16 bytes of spills on sm_80/sm_90, which the build rejects) and an A100 SM
// holds only two of its ~70 KB CTAs anyway.
constexpr int min_ctas_per_sm(int head_dim) { return head_dim == 128 ? 2 : 3; }
constexpr int kMinPartitionTokens = 256;  // smallest split-K partition (4 tiles)
constexpr int kMaxSplits = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kKeysPerWarp * 2 == 32, "the score phase maps two lanes to each key of a warp");
static_assert(kRows == 8, "row arrays are moved as 8-float vectors");

// Compile-time shapes of the (dtype, head_dim) variant.
template <typename T, int HEAD_DIM>
struct AttentionTraits {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte chunk
  static constexpr int kChunks = HEAD_DIM / kVec;                // chunks per K/V/q row
  // Value phase: thread (chunk, key group); a key group covers kKeysPerGroup keys of a tile.
  static constexpr int kKeyGroups = kThreads / kChunks;
  static constexpr int kKeysPerGroup = kTileTokens / kKeyGroups;
  static constexpr int kLoadsPerThread = kTileTokens * kChunks / kThreads;  // per K (and V) tile
  static_assert(kVec == 8, "16-bit element types only");
  static_assert(kChunks >= 8 && 32 % kChunks == 0, "head_dim must be 64 or 128");
  static_assert(kKeysPerGroup * (32 / kChunks) == kKeysPerWarp,
                "a warp's value-phase keys must be its score-phase keys");
  static_assert(kLoadsPerThread * kThreads == kTileTokens * kChunks);

  // Dynamic shared memory, in this order:
  //   K tiles   [kStages][kTileTokens][HEAD_DIM] T (chunks swizzled, see swizzle())
  //   V tiles   [kStages][kTileTokens][HEAD_DIM] T (same swizzle)
  //   q         [kRows][HEAD_DIM] float, pre-multiplied by scale * log2(e)
  //   p         [kTileTokens][kRows] float, this tile's probabilities
  // After the key loop the K/V region holds the per-warp partial outputs
  //   o_part    [kWarps][kRows][HEAD_DIM] float.
  static constexpr size_t kTileElems = static_cast<size_t>(kTileTokens) * HEAD_DIM;
  static constexpr size_t kKvBytes = 2 * kStages * kTileElems * sizeof(T);
  static constexpr size_t kQBytes = static_cast<size_t>(kRows) * HEAD_DIM * sizeof(float);
  static constexpr size_t kPBytes = static_cast<size_t>(kTileTokens) * kRows * sizeof(float);
  static constexpr size_t kSmemBytes = kKvBytes + kQBytes + kPBytes;
  static_assert(static_cast<size_t>(kWarps) * kRows * HEAD_DIM * sizeof(float) <= kKvBytes);
};

// Arguments of both kernels (passed by value).
struct KernelParams {
  void* out;
  const void* q;
  const void* kv_cache;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* cu_q_lens;
  float* ws_out;  // [max_splits][num_tokens][num_heads][head_dim], unnormalised sums
  float* ws_max;  // [max_splits][num_tokens][num_heads], running max (log2 units)
  float* ws_sum;  // [max_splits][num_tokens][num_heads], sum of exp2(score - max)
  int64_t q_stride_token;
  int64_t q_stride_head;
  int64_t kv_stride_block;
  int64_t kv_stride_kv;
  int64_t kv_stride_head;
  int64_t kv_stride_token;
  int num_tokens;
  int num_seqs;
  int num_heads;
  int group_size;  // num_heads / num_kv_heads
  int max_blocks_per_seq;
  int log2_block_size;
  int max_splits;
  int one_tile_per_seq;  // 1: work item x is sequence x (every q_len * G <= kRows)
  float scale_log2;      // scale * log2(e): scores live in log2 units, softmax uses exp2
};

// ---- small device helpers -----------------------------------------------------------------------

template <typename T>
struct Packed2;
template <>
struct Packed2<__half> {
  using type = __half2;
};
template <>
struct Packed2<__nv_bfloat16> {
  using type = __nv_bfloat162;
};

__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

template <typename T>
__device__ __forceinline__ typename Packed2<T>::type pack2(float a, float b);
template <>
__device__ __forceinline__ __half2 pack2<__half>(float a, float b) {
  return __floats2half2_rn(a, b);
}
template <>
__device__ __forceinline__ __nv_bfloat162 pack2<__nv_bfloat16>(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}

// 8 elements of T (one 16-byte chunk) -> 8 floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  using P = typename Packed2<T>::type;
  const P* pairs = reinterpret_cast<const P*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = to_float2(pairs[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  using P = typename Packed2<T>::type;
  uint4 raw;
  P* pairs = reinterpret_cast<P*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = pack2<T>(f[2 * i], f[2 * i + 1]);
  return raw;
}

__device__ __forceinline__ void load_float8(const float* src, float (&f)[8]) {
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

__device__ __forceinline__ void store_float8(float* dst, const float (&f)[8]) {
  reinterpret_cast<float4*>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// Physical chunk of logical chunk c of key row t in a K/V tile. XOR-ing bits 1-2 with the key's
// low bits makes both access patterns conflict-free: the score phase (8 lanes of a quarter warp
// = 4 keys x 2 interleaved halves read 8 distinct bank groups) and the value phase and cp.async
// staging (8 lanes read/write 8 consecutive chunks of one key: a permutation within them).
__device__ __forceinline__ int swizzle(int t, int c) { return c ^ ((t & 3) << 1); }

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Keys per split-K partition of a sequence with `ctx` keys: a multiple of kTileTokens. Both
// kernels derive a sequence's split from its own length with this function, so short sequences
// in a split launch are not split (they are written directly by the main kernel).
__device__ __forceinline__ int partition_tokens(int ctx, int max_splits) {
  const int num_parts = min(max_splits, max(1, ceil_div(ctx, kMinPartitionTokens)));
  return ceil_div(ceil_div(max(ctx, 1), num_parts), kTileTokens) * kTileTokens;
}

// First work item of sequence s in the general mapping: floor(cu_q_lens[s] * G / kRows) + s.
// Sequence s needs ceil(q_len_s * G / kRows) items, which always fit before the next start;
// the few spare items exit at once.
__device__ __forceinline__ int64_t work_start(const int32_t* cu_q_lens, int s, int group_size) {
  return static_cast<int64_t>(cu_q_lens[s]) * group_size / kRows + s;
}

// The sequence owning packed query token `token`: the largest s with cu_q_lens[s] <= token.
__device__ __forceinline__ int seq_of_token(const int32_t* cu_q_lens, int num_seqs, int token) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_q_lens[mid] <= token) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <typename Op>
__device__ __forceinline__ float reduce_over_keys(float v, Op op) {
  // Lanes 2k and 2k+1 hold the same key; reduce over the 16 keys of the warp (lane bits 1-4).
#pragma unroll
  for (int offset = 2; offset < 32; offset *= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// ---- main kernel --------------------------------------------------------------------------------

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm(HEAD_DIM))
    paged_attention_kernel(const KernelParams p) {
  using Traits = AttentionTraits<T, HEAD_DIM>;
  constexpr int kVec = Traits::kVec;
  constexpr int kChunks = Traits::kChunks;

  STRATA_DYNAMIC_SHARED(unsigned char, smem, 16);
  T* k_tiles = reinterpret_cast<T*>(smem);
  T* v_tiles = k_tiles + kStages * Traits::kTileElems;
  float* o_part = reinterpret_cast<float*>(smem);  // after the key loop only
  float* q_s = reinterpret_cast<float*>(smem + Traits::kKvBytes);
  float* p_s = q_s + kRows * HEAD_DIM;
  __shared__ float warp_max[kWarps][kRows];  // becomes the merge weight of each warp
  __shared__ float warp_sum[kWarps][kRows];
  __shared__ float row_max[kRows];
  __shared__ float row_sum[kRows];
  __shared__ int row_token[kRows];
  __shared__ int row_head[kRows];
  __shared__ int row_pos[kRows];

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int kv_head = blockIdx.y;
  const int split = blockIdx.z;
  const int group_size = p.group_size;

  // Work item -> (sequence, row tile).
  int seq = blockIdx.x;
  int tile = 0;
  if (!p.one_tile_per_seq) {
    const int64_t item = blockIdx.x;
    int lo = 0, hi = p.num_seqs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (work_start(p.cu_q_lens, mid, group_size) <= item) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    seq = lo;
    tile = static_cast<int>(item - work_start(p.cu_q_lens, seq, group_size));
  }
  const int q_begin = p.cu_q_lens[seq];
  const int q_len = p.cu_q_lens[seq + 1] - q_begin;
  const int ctx = p.seq_lens[seq];
  const int first_row = tile * kRows;
  const int num_rows = min(kRows, q_len * group_size - first_row);
  if (num_rows <= 0) return;
  // max_q_len smaller than a real q_len would silently drop rows: fail loudly instead.
  if (p.one_tile_per_seq && q_len * group_size > kRows) __trap();

  // Keys this CTA reads: its split of [0, position of its last row + 1).
  const int first_pos = ctx - q_len;
  const int kv_end = first_pos + (first_row + num_rows - 1) / group_size + 1;
  const int part = partition_tokens(ctx, p.max_splits);
  const bool direct = ceil_div(ctx, part) == 1;  // sequence not split: write `out` here
  const int k_begin = split * part;
  if (k_begin >= kv_end) return;
  const int k_end = min(k_begin + part, kv_end);

  if (tid < kRows) {
    const int row = first_row + tid;
    row_token[tid] = q_begin + row / group_size;
    row_head[tid] = kv_head * group_size + row % group_size;
    row_pos[tid] = tid < num_rows ? first_pos + row / group_size : -1;  // -1: padding row
  }
  __syncthreads();

  // Stage q (scaled into log2 units) as float.
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (r < num_rows) {
      const T* src = static_cast<const T*>(p.q) + row_token[r] * p.q_stride_token +
                     row_head[r] * p.q_stride_head + c * kVec;
      unpack8<T>(*reinterpret_cast<const uint4*>(src), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] *= p.scale_log2;
    }
    store_float8(q_s + r * HEAD_DIM + c * kVec, f);
  }

  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const T* kv_base = static_cast<const T*>(p.kv_cache) + kv_head * p.kv_stride_head;
  const int offset_mask = (1 << p.log2_block_size) - 1;

  // Issues the cp.async copies of keys [tile_start, tile_start + kTileTokens) into `stage`;
  // keys at or past k_end are zero-filled and their table entries are not read.
  auto load_tile = [&](int tile_start, int stage) {
    T* k_dst = k_tiles + stage * Traits::kTileElems;
    T* v_dst = v_tiles + stage * Traits::kTileElems;
#pragma unroll
    for (int i = 0; i < Traits::kLoadsPerThread; ++i) {
      const int idx = tid + i * kThreads;
      const int t = idx / kChunks;
      const int c = idx % kChunks;
      const int key = tile_start + t;
      const bool in_range = key < k_end;
      const T* k_src = kv_base;  // any valid address when !in_range (not read)
      const T* v_src = kv_base;
      if (in_range) {
        const int64_t block = table[key >> p.log2_block_size];
        k_src = kv_base + block * p.kv_stride_block + (key & offset_mask) * p.kv_stride_token +
                c * kVec;
        v_src = k_src + p.kv_stride_kv;
      }
      const int dst = t * HEAD_DIM + swizzle(t, c) * kVec;
      ptx::cp_async_16(k_dst + dst, k_src, in_range);
      ptx::cp_async_16(v_dst + dst, v_src, in_range);
    }
  };

  // Per-warp online-softmax state; identical in all lanes of a warp (butterfly reductions).
  float m[kRows];
  float l[kRows];
  float acc[kRows][8];  // value phase: rows x the 8 dims of this thread's chunk
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] = 0.0f;
  }
  const int s_key = warp * kKeysPerWarp + lane / 2;  // score phase: key of this lane pair
  const int s_half = lane & 1;                       // ... and which interleaved half of dims
  const int v_chunk = tid % kChunks;                 // value phase: dims chunk
  const int v_group = tid / kChunks;                 // ... and key group

  const int num_tiles = ceil_div(k_end - k_begin, kTileTokens);
  load_tile(k_begin, 0);
  ptx::cp_async_commit();
  for (int it = 0; it < num_tiles; ++it) {
    if (it + 1 < num_tiles) load_tile(k_begin + (it + 1) * kTileTokens, (it + 1) % kStages);
    ptx::cp_async_commit();  // possibly empty: keeps the group count uniform for wait<1>
    ptx::cp_async_wait<1>();
    __syncthreads();
    const T* k_tile = k_tiles + (it % kStages) * Traits::kTileElems;
    const T* v_tile = v_tiles + (it % kStages) * Traits::kTileElems;
    const int tile_start = k_begin + it * kTileTokens;

    // Scores of key s_key against every row: each lane of the pair covers half of the chunks.
    float s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = 0.0f;
    const T* k_row = k_tile + s_key * HEAD_DIM;
#pragma unroll
    for (int cc = 0; cc < kChunks / 2; ++cc) {
      const int c = 2 * cc + s_half;
      float kf[8];
      unpack8<T>(*reinterpret_cast<const uint4*>(k_row + swizzle(s_key, c) * kVec), kf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < num_rows) {
          float qf[8];
          load_float8(q_s + r * HEAD_DIM + c * kVec, qf);  // broadcast within the warp
#pragma unroll
          for (int e = 0; e < 8; ++e) s[r] = fmaf(qf[e], kf[e], s[r]);
        }
      }
    }

    // Online softmax over this warp's 16 keys.
    const int key = tile_start + s_key;
    float alpha[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      alpha[r] = 0.0f;
      if (r < num_rows) {
        float score = s[r] + __shfl_xor_sync(kFullMask, s[r], 1);
        score = (key < k_end && key <= row_pos[r]) ? score : -INFINITY;
        const float tile_max =
            reduce_over_keys(score, [](float a, float b) { return fmaxf(a, b); });
        const float m_new = fmaxf(m[r], tile_max);
        alpha[r] = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - m_new);
        const float prob = score == -INFINITY ? 0.0f : exp2f(score - m_new);
        l[r] = l[r] * alpha[r] + reduce_over_keys(prob, [](float a, float b) { return a + b; });
        m[r] = m_new;
        s[r] = prob;
      } else {
        s[r] = 0.0f;
      }
    }
    if (s_half == 0) store_float8(p_s + s_key * kRows, s);
    __syncwarp();

    // acc[r][:] = alpha * acc[r][:] + sum over this thread's keys of p[key][r] * v[key][chunk].
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < num_rows) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][e] *= alpha[r];
      }
    }
#pragma unroll
    for (int kk = 0; kk < Traits::kKeysPerGroup; ++kk) {
      const int t = v_group * Traits::kKeysPerGroup + kk;
      float vf[8];
      const T* v_row = v_tile + t * HEAD_DIM;
      unpack8<T>(*reinterpret_cast<const uint4*>(v_row + swizzle(t, v_chunk) * kVec), vf);
      float pr[8];
      load_float8(p_s + t * kRows, pr);  // broadcast
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < num_rows) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][e] = fmaf(pr[r], vf[e], acc[r][e]);
        }
      }
    }
    __syncthreads();  // this stage and p_s are read before they are overwritten
  }
  ptx::cp_async_wait<0>();

  // Merge the key groups of each warp (lanes sharing v_chunk) ...
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r < num_rows) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
#pragma unroll
        for (int offset = kChunks; offset < 32; offset *= 2) {
          acc[r][e] += __shfl_xor_sync(kFullMask, acc[r][e], offset);
        }
      }
    }
  }
  if (lane < kChunks) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < num_rows) store_float8(o_part + (warp * kRows + r) * HEAD_DIM + lane * kVec, acc[r]);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      warp_max[warp][r] = m[r];
      warp_sum[warp][r] = l[r];
    }
  }
  __syncthreads();
  // ... then the warps: weights exp2(m_w - m), m = max over warps.
  if (tid < kRows) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_max[w][tid]);
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = warp_max[w][tid] == -INFINITY ? 0.0f : exp2f(warp_max[w][tid] - mx);
      sum += weight * warp_sum[w][tid];
      warp_max[w][tid] = weight;
    }
    row_max[tid] = mx;
    row_sum[tid] = sum;
  }
  __syncthreads();

  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    if (r >= num_rows) continue;
    float o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      float part[8];
      load_float8(o_part + (w * kRows + r) * HEAD_DIM + c * kVec, part);
      const float weight = warp_max[w][r];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = fmaf(weight, part[e], o[e]);
    }
    const int64_t item = static_cast<int64_t>(row_token[r]) * p.num_heads + row_head[r];
    if (direct) {
      // Every real row sees key 0, so row_sum > 0; the guard only keeps padding NaN-free.
      const float inv = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] *= inv;
      *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + item * HEAD_DIM + c * kVec) =
          pack8<T>(o);
    } else {
      const int64_t slot = static_cast<int64_t>(split) * p.num_tokens * p.num_heads + item;
      store_float8(p.ws_out + slot * HEAD_DIM + c * kVec, o);
      if (c == 0) {
        p.ws_max[slot] = row_max[r];
        p.ws_sum[slot] = row_sum[r];
      }
    }
  }
}

// ---- split-K reduction --------------------------------------------------------------------------

// One warp per (token, head) of a split sequence: out = sum_z w_z o_z / sum_z w_z l_z with
// w_z = exp2(m_z - max m). Only the splits that hold a key <= the row's position were written.
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kThreads) paged_attention_reduce_kernel(const KernelParams p) {
  constexpr int kPerLane = HEAD_DIM / 32;
  const int lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t num_items = static_cast<int64_t>(p.num_tokens) * p.num_heads;
  if (item >= num_items) return;
  const int token = static_cast<int>(item / p.num_heads);
  const int seq = seq_of_token(p.cu_q_lens, p.num_seqs, token);
  const int q_begin = p.cu_q_lens[seq];
  const int q_len = p.cu_q_lens[seq + 1] - q_begin;
  const int ctx = p.seq_lens[seq];
  const int part = partition_tokens(ctx, p.max_splits);
  if (ceil_div(ctx, part) == 1) return;  // written directly by paged_attention_kernel
  const int pos = ctx - q_len + (token - q_begin);
  if (pos < 0) return;
  const int last_split = pos / part;

  float mx = -INFINITY;
  for (int z = 0; z <= last_split; ++z) mx = fmaxf(mx, p.ws_max[z * num_items + item]);
  float sum = 0.0f;
  float o[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) o[e] = 0.0f;
  for (int z = 0; z <= last_split; ++z) {
    const int64_t slot = z * num_items + item;
    const float m_z = p.ws_max[slot];
    const float weight = m_z == -INFINITY ? 0.0f : exp2f(m_z - mx);
    sum += weight * p.ws_sum[slot];
    const float* src = p.ws_out + slot * HEAD_DIM + lane * kPerLane;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) o[e] = fmaf(weight, src[e], o[e]);
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  T* dst = static_cast<T*>(p.out) + item * HEAD_DIM + lane * kPerLane;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) dst[e] = from_float<T>(o[e] * inv);
}

// ---- host side ----------------------------------------------------------------------------------

// Aborts with a message when a launch precondition fails (a broken invariant at this level).
#define STRATA_LAUNCH_REQUIRE(cond, ...)                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: launch_paged_attention: ", __FILE__, __LINE__);       \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fprintf(stderr, "\n");                                                        \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

int64_t host_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int current_device_sm_count() {
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  int num_sms = 0;
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  return num_sms;
}

// CTAs of the main kernel's (kind, head_dim) variant that fit on one SM of the current device
// at once. Also raises the variant's dynamic shared memory limit, which launching needs. Cached
// per (device, variant): both calls cost host time on every layer otherwise.
int resident_ctas_per_sm(DType kind, int64_t head_dim) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices][2][2];  // 0: not computed yet
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  const bool cacheable = device < kMaxCachedDevices &&
                         (kind == DType::kFloat16 || kind == DType::kBFloat16) &&
                         (head_dim == 64 || head_dim == 128);
  std::atomic<int>* slot =
      cacheable ? &cache[device][kind == DType::kBFloat16][head_dim == 128] : nullptr;
  if (slot != nullptr) {
    const int cached = slot->load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int ctas = 1;
  STRATA_DISPATCH_HALF_SCALAR(kind, [&] {
    STRATA_DISPATCH_HEAD_DIM(head_dim, [&] {
      using Traits = AttentionTraits<scalar_t, HEAD_DIM>;
      auto* kernel = paged_attention_kernel<scalar_t, HEAD_DIM>;
      STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(Traits::kSmemBytes)));
      STRATA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kThreads,
                                                                      Traits::kSmemBytes));
    });
  });
  ctas = std::max(ctas, 1);
  if (slot != nullptr) slot->store(ctas, std::memory_order_relaxed);
  return ctas;
}

// Grid shape chosen from host-known sizes only (no device sync, CUDA-graph friendly).
struct LaunchPlan {
  bool one_tile_per_seq;
  int64_t num_work;    // grid.x
  int64_t num_splits;  // grid.z
};

LaunchPlan plan_launch(const PagedAttentionParams& params, int64_t resident_ctas) {
  LaunchPlan plan{};
  const int64_t group_size = params.num_heads / params.num_kv_heads;
  plan.one_tile_per_seq = params.max_q_len * group_size <= kRows;
  plan.num_work = plan.one_tile_per_seq
                      ? params.num_seqs
                      : params.num_tokens * group_size / kRows + params.num_seqs;
  // Split contexts so that the grid fills one wave of the GPU (every SM holds as many CTAs as
  // fit), never more: a partial second wave would leave SMs idle. Each split keeps at least
  // kMinPartitionTokens keys, and no split is needed once the unsplit grid fills the wave.
  const int64_t base_ctas = std::max<int64_t>(1, plan.num_work * params.num_kv_heads);
  const int64_t max_ctx = params.max_blocks_per_seq * params.block_size;
  const int64_t by_length = std::max<int64_t>(1, host_ceil_div(max_ctx, kMinPartitionTokens));
  plan.num_splits =
      std::clamp<int64_t>(std::min(resident_ctas / base_ctas, by_length), 1, kMaxSplits);
  return plan;
}

// One wave: SMs of the current device times the CTAs of this variant that fit on one.
int64_t resident_ctas(const PagedAttentionParams& params) {
  return int64_t{current_device_sm_count()} * resident_ctas_per_sm(params.kind, params.head_dim);
}

size_t workspace_bytes_for(const PagedAttentionParams& params, const LaunchPlan& plan) {
  if (plan.num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(plan.num_splits) * params.num_tokens * params.num_heads;
  return rows * (params.head_dim + 2) * sizeof(float);
}

}  // namespace

size_t paged_attention_workspace_bytes(const PagedAttentionParams& params) {
  if (params.num_tokens == 0 || params.num_seqs == 0 || params.num_kv_heads <= 0) return 0;
  return workspace_bytes_for(params, plan_launch(params, resident_ctas(params)));
}

void launch_paged_attention(const PagedAttentionParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0 || params.num_seqs == 0) return;
  STRATA_LAUNCH_REQUIRE(params.num_heads > 0 && params.num_kv_heads > 0 &&
                            params.num_kv_heads <= 65535 &&
                            params.num_heads % params.num_kv_heads == 0,
                        "num_heads %lld must be a multiple of num_kv_heads %lld (<= 65535)",
                        static_cast<long long>(params.num_heads),
                        static_cast<long long>(params.num_kv_heads));
  STRATA_LAUNCH_REQUIRE(params.block_size > 0 && params.block_size <= (1 << 20) &&
                            (params.block_size & (params.block_size - 1)) == 0,
                        "block_size %lld must be a power of two",
                        static_cast<long long>(params.block_size));
  STRATA_LAUNCH_REQUIRE(params.num_tokens < (int64_t{1} << 31) / params.num_heads &&
                            params.num_seqs < (int64_t{1} << 30) && params.max_q_len >= 1,
                        "sizes out of range (num_tokens %lld, num_seqs %lld, max_q_len %lld)",
                        static_cast<long long>(params.num_tokens),
                        static_cast<long long>(params.num_seqs),
                        static_cast<long long>(params.max_q_len));
  const LaunchPlan plan = plan_launch(params, resident_ctas(params));
  const size_t needed = workspace_bytes_for(params, plan);
  STRATA_LAUNCH_REQUIRE(params.workspace_bytes >= needed && (needed == 0 || params.workspace),
                        "workspace of %zu bytes, %zu needed", params.workspace_bytes, needed);

  int log2_block_size = 0;
  while ((int64_t{1} << log2_block_size) < params.block_size) ++log2_block_size;
  const size_t split_rows =
      static_cast<size_t>(plan.num_splits) * params.num_tokens * params.num_heads;
  float* ws = static_cast<float*>(params.workspace);
  KernelParams kp{};
  kp.out = params.out;
  kp.q = params.q;
  kp.kv_cache = params.kv_cache;
  kp.block_tables = params.block_tables;
  kp.seq_lens = params.seq_lens;
  kp.cu_q_lens = params.cu_q_lens;
  kp.ws_out = needed ? ws : nullptr;
  kp.ws_max = needed ? ws + split_rows * params.head_dim : nullptr;
  kp.ws_sum = needed ? ws + split_rows * (params.head_dim + 1) : nullptr;
  kp.q_stride_token = params.q_stride_token;
  kp.q_stride_head = params.q_stride_head;
  kp.kv_stride_block = params.kv_stride_block;
  kp.kv_stride_kv = params.kv_stride_kv;
  kp.kv_stride_head = params.kv_stride_head;
  kp.kv_stride_token = params.kv_stride_token;
  kp.num_tokens = static_cast<int>(params.num_tokens);
  kp.num_seqs = static_cast<int>(params.num_seqs);
  kp.num_heads = static_cast<int>(params.num_heads);
  kp.group_size = static_cast<int>(params.num_heads / params.num_kv_heads);
  kp.max_blocks_per_seq = static_cast<int>(params.max_blocks_per_seq);
  kp.log2_block_size = log2_block_size;
  kp.max_splits = static_cast<int>(plan.num_splits);
  kp.one_tile_per_seq = plan.one_tile_per_seq ? 1 : 0;
  kp.scale_log2 = params.scale * kLog2e;

  const dim3 grid(static_cast<unsigned>(plan.num_work), static_cast<unsigned>(params.num_kv_heads),
                  static_cast<unsigned>(plan.num_splits));
  const unsigned reduce_blocks =
      static_cast<unsigned>(host_ceil_div(params.num_tokens * params.num_heads, kWarps));
  STRATA_DISPATCH_HALF_SCALAR(params.kind, [&] {
    STRATA_DISPATCH_HEAD_DIM(params.head_dim, [&] {
      using Traits = AttentionTraits<scalar_t, HEAD_DIM>;
      // The shared memory limit of this variant was raised by resident_ctas_per_sm.
      launch_kernel(paged_attention_kernel<scalar_t, HEAD_DIM>,
                    {grid, kThreads, Traits::kSmemBytes, stream}, kp);
      STRATA_CUDA_CHECK(cudaGetLastError());
      if (plan.num_splits > 1) {
        launch_kernel(paged_attention_reduce_kernel<scalar_t, HEAD_DIM>,
                      {reduce_blocks, kThreads, 0, stream}, kp);
        STRATA_CUDA_CHECK(cudaGetLastError());
      }
    });
  });
}

}  // namespace strata::kernels
