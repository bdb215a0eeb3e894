// LeanKV's quantize-on-append (contract in ops.h, LeanKvWriteParams; the libtorch reference is
// kernels::aten::leankv_write_tokens): one warp per token. Each lane holds head_dim / 32
// consecutive elements of the token's key (then value), the warp reduces min and max, the fp16
// scale and zero are those of the reference (rounded before use), and each lane packs its codes
// and stores them where the page's chunked layout puts its bytes; lanes that hold half a byte
// (2-bit codes at head_dim 64) pair up through a shuffle. Bit-identical to the reference.

#include <cmath>
#include <cstdint>

#include "../common/dispatch.cuh"

namespace strata::kernels {
namespace {

using kv::leankv::PageSegments;

constexpr int kWarpsPerBlock = 4;

// Quantizes one row (the warp's token's key or value) and stores its data and params.
template <int BITS, int D>
__device__ __forceinline__ void write_row(const void* src, int64_t token, DType kind,
                                          unsigned char* page, int slot, int tokens,
                                          int64_t data_offset, int64_t params_offset) {
  constexpr int kFeatures = D / 32;
  constexpr int kLaneBits = kFeatures * BITS;  // 4 .. 32
  constexpr int kRowBytes = D * BITS / 8;
  constexpr int kChunk = kRowBytes < 64 ? kRowBytes : 64;
  constexpr uint32_t kMaxCode = (1u << BITS) - 1;
  const int lane = threadIdx.x % 32;
  float x[kFeatures];
  float lo = INFINITY, hi = -INFINITY;
#pragma unroll
  for (int j = 0; j < kFeatures; ++j) {
    x[j] = load_element(src, token * D + lane * kFeatures + j, kind);
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
  const int row_byte = lane * kLaneBits / 8;
  unsigned char* at = page + data_offset +
                      (static_cast<int64_t>(row_byte / kChunk) * tokens + slot) * kChunk +
                      row_byte % kChunk;
  if constexpr (kLaneBits == 4) {
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

template <int D>
__device__ __forceinline__ void write_row_bits(int bits, const void* src, int64_t token, DType kind,
                                               unsigned char* page, int slot, int tokens,
                                               int64_t data_offset, int64_t params_offset) {
  if (bits == 8) write_row<8, D>(src, token, kind, page, slot, tokens, data_offset, params_offset);
  if (bits == 4) write_row<4, D>(src, token, kind, page, slot, tokens, data_offset, params_offset);
  if (bits == 2) write_row<2, D>(src, token, kind, page, slot, tokens, data_offset, params_offset);
}

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    leankv_write_tokens_kernel(const LeanKvWriteParams p) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= p.num_tokens) return;  // whole warps leave together
  const PageSegments& seg = p.segments;
  unsigned char* page = p.pool + p.page[token] * p.page_bytes;
  const int slot = static_cast<int>(p.slot[token]);
  write_row_bits<D>(p.bits.key, p.key, token, p.kind, page, slot, seg.tokens, seg.key_data,
                    seg.key_params);
  write_row_bits<D>(p.bits.value, p.value, token, p.kind, page, slot, seg.tokens, seg.value_data,
                    seg.value_params);
  if (threadIdx.x % 32 == 0) {
    reinterpret_cast<float*>(page + seg.scores)[slot] = p.acc[token];
    reinterpret_cast<int32_t*>(page + seg.positions)[slot] = p.position[token];
  }
}

}  // namespace

void launch_leankv_write_tokens(const LeanKvWriteParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0) return;
  const unsigned blocks =
      static_cast<unsigned>((params.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  STRATA_DISPATCH_HEAD_DIM(params.head_dim, [&] {
    launch_kernel(leankv_write_tokens_kernel<HEAD_DIM>, {blocks, kWarpsPerBlock * 32, 0, stream},
                  params);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
