// One token's key or value row in a LeanKV page (kv/leankv_page_format.h), read and written by one
// warp: each lane holds head_dim / 32 consecutive features of the row in registers. Shared by the
// quantize-on-append kernel (write_tokens.cu) and the decode step (settle.cu); the libtorch
// reference is kernels::aten::leankv_write_tokens / leankv_read_tokens, which these match bit for
// bit: the fp16 scale and zero are rounded before use, and dequantization is scale * q + zero
// with each operation rounded (no fused multiply-add).
#pragma once

#include <cmath>
#include <cstdint>

#include "../common/dispatch.cuh"

namespace strata::kernels::leankv_rows {

// Where this lane's codes of a row of `BITS`-bit codes lie in the page's chunked layout: chunk c
// of the token at `slot` is at data_offset + (c * tokens + slot) * C.
template <int BITS, int D>
__device__ __forceinline__ int64_t lane_byte(int lane, int slot, int tokens, int64_t data_offset) {
  constexpr int kLaneBits = D / 32 * BITS;  // 4 .. 32
  constexpr int kRowBytes = D * BITS / 8;
  constexpr int kChunk = kRowBytes < 64 ? kRowBytes : 64;
  const int row_byte = lane * kLaneBits / 8;
  return data_offset + (static_cast<int64_t>(row_byte / kChunk) * tokens + slot) * kChunk +
         row_byte % kChunk;
}

// Quantizes the warp's row x (per token, min-max to BITS bits) and stores its codes and its fp16
// scale and zero at `slot` of `page`.
template <int BITS, int D>
__device__ __forceinline__ void store_row(const float (&x)[D / 32], unsigned char* page, int slot,
                                          int tokens, int64_t data_offset, int64_t params_offset) {
  constexpr int kFeatures = D / 32;
  constexpr int kLaneBits = kFeatures * BITS;
  constexpr uint32_t kMaxCode = (1u << BITS) - 1;
  const int lane = threadIdx.x % 32;
  float lo = INFINITY, hi = -INFINITY;
#pragma unroll
  for (int j = 0; j < kFeatures; ++j) {
    lo = fminf(lo, x[j]);
    hi = fmaxf(hi, x[j]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
  }
  const __half scale_h = __float2half_rn((hi - lo) / static_cast<float>(kMaxCode));
  const __half zero_h = __float2half_rn(lo);
  const float scale = __half2float(scale_h), zero = __half2float(zero_h);
  const float divisor = scale > 0.0f ? scale : 1.0f;
  uint32_t codes = 0;
#pragma unroll
  for (int j = 0; j < kFeatures; ++j) {
    const float q =
        fminf(fmaxf(rintf((x[j] - zero) / divisor), 0.0f), static_cast<float>(kMaxCode));
    codes |= static_cast<uint32_t>(q) << (j * BITS);
  }
  unsigned char* at = page + lane_byte<BITS, D>(lane, slot, tokens, data_offset);
  if constexpr (kLaneBits == 4) {  // two lanes share a byte: the even lane writes both halves
    const uint32_t upper = __shfl_down_sync(0xffffffffu, codes, 1);
    if (lane % 2 == 0) *at = static_cast<unsigned char>(codes | (upper << 4));
  } else if constexpr (kLaneBits == 8) {
    *at = static_cast<unsigned char>(codes);
  } else if constexpr (kLaneBits == 16) {
    *reinterpret_cast<uint16_t*>(at) = static_cast<uint16_t>(codes);
  } else {
    *reinterpret_cast<uint32_t*>(at) = codes;
  }
  if (lane == 0) {
    __half* params =
        reinterpret_cast<__half*>(page + params_offset + 4 * static_cast<int64_t>(slot));
    params[0] = scale_h;
    params[1] = zero_h;
  }
}

// Dequantizes the row of BITS-bit codes at `slot` of `page` into x (scale * q + zero).
template <int BITS, int D>
__device__ __forceinline__ void load_row(const unsigned char* page, int slot, int tokens,
                                         int64_t data_offset, int64_t params_offset,
                                         float (&x)[D / 32]) {
  constexpr int kFeatures = D / 32;
  constexpr int kLaneBits = kFeatures * BITS;
  constexpr uint32_t kMask = (1u << BITS) - 1;
  const int lane = threadIdx.x % 32;
  const unsigned char* at = page + lane_byte<BITS, D>(lane, slot, tokens, data_offset);
  uint32_t codes;
  if constexpr (kLaneBits == 4) {
    codes = (*at >> (4 * (lane % 2))) & 0xFu;
  } else if constexpr (kLaneBits == 8) {
    codes = *at;
  } else if constexpr (kLaneBits == 16) {
    codes = *reinterpret_cast<const uint16_t*>(at);
  } else {
    codes = *reinterpret_cast<const uint32_t*>(at);
  }
  const __half* params =
      reinterpret_cast<const __half*>(page + params_offset + 4 * static_cast<int64_t>(slot));
  const float scale = __half2float(params[0]), zero = __half2float(params[1]);
#pragma unroll
  for (int j = 0; j < kFeatures; ++j) {
    x[j] = __fadd_rn(__fmul_rn(static_cast<float>((codes >> (j * BITS)) & kMask), scale), zero);
  }
}

// store_row / load_row with the bits (8, 4 or 2) chosen at run time.
template <int D>
__device__ __forceinline__ void store_row_bits(int bits, const float (&x)[D / 32],
                                               unsigned char* page, int slot, int tokens,
                                               int64_t data_offset, int64_t params_offset) {
  if (bits == 8) store_row<8, D>(x, page, slot, tokens, data_offset, params_offset);
  if (bits == 4) store_row<4, D>(x, page, slot, tokens, data_offset, params_offset);
  if (bits == 2) store_row<2, D>(x, page, slot, tokens, data_offset, params_offset);
}

template <int D>
__device__ __forceinline__ void load_row_bits(int bits, const unsigned char* page, int slot,
                                              int tokens, int64_t data_offset,
                                              int64_t params_offset, float (&x)[D / 32]) {
  if (bits == 8) load_row<8, D>(page, slot, tokens, data_offset, params_offset, x);
  if (bits == 4) load_row<4, D>(page, slot, tokens, data_offset, params_offset, x);
  if (bits == 2) load_row<2, D>(page, slot, tokens, data_offset, params_offset, x);
}

// This lane's features of row `token` of a [n, D] array of `kind`.
template <int D>
__device__ __forceinline__ void gather_row(const void* src, int64_t token, DType kind,
                                           float (&x)[D / 32]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < D / 32; ++j) x[j] = load_element(src, token * D + lane * (D / 32) + j, kind);
}

}  // namespace strata::kernels::leankv_rows
