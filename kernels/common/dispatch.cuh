// Shared device helpers: dtype dispatch, float conversion, reductions, error checks.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "cuda_compat.cuh"
#include "strata/kernels/ops.h"

#define STRATA_CUDA_CHECK(expr)                                                          \
  do {                                                                                   \
    cudaError_t strata_err_ = (expr);                                                    \
    if (strata_err_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, #expr,      \
                   cudaGetErrorString(strata_err_));                                     \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// Runs BODY with `scalar_t` bound to the element type of KIND; aborts on an unknown kind.
#define STRATA_DISPATCH_SCALAR(KIND, ...)                                        \
  switch (KIND) {                                                                \
    case ::strata::kernels::DType::kFloat32: {                                   \
      using scalar_t = float;                                                    \
      __VA_ARGS__();                                                             \
      break;                                                                     \
    }                                                                            \
    case ::strata::kernels::DType::kFloat16: {                                   \
      using scalar_t = __half;                                                   \
      __VA_ARGS__();                                                             \
      break;                                                                     \
    }                                                                            \
    case ::strata::kernels::DType::kBFloat16: {                                  \
      using scalar_t = __nv_bfloat16;                                            \
      __VA_ARGS__();                                                             \
      break;                                                                     \
    }                                                                            \
    default:                                                                     \
      std::fprintf(stderr, "%s:%d: unsupported scalar kind\n", __FILE__, __LINE__); \
      std::abort();                                                              \
  }

namespace strata::kernels {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(float v) { return v; }
template <>
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

// Element i of an array of `kind` (float32, float16 or bfloat16) as a float: for kernels that
// take the element type at run time instead of as a template parameter.
__device__ __forceinline__ float load_element(const void* base, int64_t i, DType kind) {
  switch (kind) {
    case DType::kFloat16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Rounds a float32 to T and back: emulates an intermediate stored in T.
template <typename T>
__device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

// Sum over all threads of a block (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x / 32;
  v = lane < num_warps ? partial[lane] : 0.0f;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

// Aborts (a broken invariant: the adapters validate first) unless num_heads query heads fall in
// groups of at most max_group over num_kv_heads KV heads; `kernel` names the launcher.
inline void check_query_groups(const char* kernel, int64_t num_heads, int64_t num_kv_heads,
                               int max_group) {
  if (num_kv_heads > 0 && num_heads % num_kv_heads == 0 && num_heads / num_kv_heads <= max_group) {
    return;
  }
  std::fprintf(stderr, "%s: %lld query heads over %lld KV heads (groups of at most %d)\n", kernel,
               static_cast<long long>(num_heads), static_cast<long long>(num_kv_heads), max_group);
  std::abort();
}

// Exclusive prefix sum of v over the block's threads (blockDim.x a multiple of 32), and the total.
__device__ __forceinline__ long long block_exclusive_scan(long long v, long long* total) {
  __shared__ long long warp_sums[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  long long inclusive = v;
  for (int d = 1; d < 32; d *= 2) {
    const long long up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    long long s = lane < num_warps ? warp_sums[lane] : 0;
    for (int d = 1; d < 32; d *= 2) {
      const long long up = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += up;
    }
    if (lane < num_warps) warp_sums[lane] = s;
  }
  __syncthreads();
  const long long before = warp == 0 ? 0 : warp_sums[warp - 1];
  *total = warp_sums[num_warps - 1];
  __syncthreads();  // warp_sums is free for the next scan
  return before + inclusive - v;
}

}  // namespace strata::kernels

// Runs BODY with `scalar_t` bound to the 16-bit element type of KIND (fp16 or bf16); aborts on
// any other kind. For kernels that exist only for the CUDA serving dtypes (paged attention).
#define STRATA_DISPATCH_HALF_SCALAR(KIND, ...)                                              \
  switch (KIND) {                                                                           \
    case ::strata::kernels::DType::kFloat16: {                                              \
      using scalar_t = __half;                                                              \
      __VA_ARGS__();                                                                        \
      break;                                                                                \
    }                                                                                       \
    case ::strata::kernels::DType::kBFloat16: {                                             \
      using scalar_t = __nv_bfloat16;                                                       \
      __VA_ARGS__();                                                                        \
      break;                                                                                \
    }                                                                                       \
    default:                                                                                \
      std::fprintf(stderr, "%s:%d: scalar kind not supported here (fp16/bf16 only)\n",      \
                   __FILE__, __LINE__);                                                     \
      std::abort();                                                                         \
  }

// Runs BODY with `constexpr int HEAD_DIM` bound to VALUE (64 or 128); aborts on any other size.
#define STRATA_DISPATCH_HEAD_DIM(VALUE, ...)                                                \
  switch (VALUE) {                                                                          \
    case 64: {                                                                              \
      constexpr int HEAD_DIM = 64;                                                          \
      __VA_ARGS__();                                                                        \
      break;                                                                                \
    }                                                                                       \
    case 128: {                                                                             \
      constexpr int HEAD_DIM = 128;                                                         \
      __VA_ARGS__();                                                                        \
      break;                                                                                \
    }                                                                                       \
    default:                                                                                \
      std::fprintf(stderr, "%s:%d: unsupported head_dim %lld (64 or 128)\n", __FILE__,      \
                   __LINE__, static_cast<long long>(VALUE));                                \
      std::abort();                                                                         \
  }
