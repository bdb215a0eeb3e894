// Functional model of ldmatrix.x4 and mma.sync.m16n8k16 (fp16/bf16 inputs, fp32 accumulate).
// Fragment layouts follow the PTX ISA (sections "Matrix Fragments for mma.m16n8k16 with
// floating point type" and "ldmatrix"), as restated in kernels/common/ptx.cuh; the arithmetic is
// fp32 multiply-add in k order (the hardware's order of the 16 products is unspecified, so
// results may differ from a GPU by fp32 rounding only).

#include <cstring>

#include "cuemu/cuemu.h"

namespace cuemu {
namespace {

enum Arg { kBf16 = 1, kTrans = 1 };

float half_to_float(uint16_t bits, bool bf16) {
  if (bf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

uint16_t low(uint32_t w) { return static_cast<uint16_t>(w & 0xffffu); }
uint16_t high(uint32_t w) { return static_cast<uint16_t>(w >> 16); }

}  // namespace

namespace detail {

void tensor_core_model(const WarpRequest& request, const uint32_t (*in)[16], uint32_t (*out)[16]) {
  if (request.op == WarpOp::kLdmatrix) {
    // in[l][0..1]: lane l's row address; the row of matrix i, row j is lane 8i + j's address.
    for (int i = 0; i < 4; ++i) {
      uint16_t m[8][8];
      for (int row = 0; row < 8; ++row) {
        uintptr_t addr = 0;
        std::memcpy(&addr, in[8 * i + row], sizeof(addr));
        std::memcpy(m[row], reinterpret_cast<const void*>(addr), 16);
      }
      for (int l = 0; l < 32; ++l) {
        const int a = l / 4, b = 2 * (l % 4);
        const uint16_t lo = request.arg == kTrans ? m[b][a] : m[a][b];
        const uint16_t hi = request.arg == kTrans ? m[b + 1][a] : m[a][b + 1];
        out[l][i] = uint32_t{lo} | uint32_t{hi} << 16;
      }
    }
    return;
  }
  // mma.m16n8k16: in[l] = a[0..3], b[0..1], c[0..3] (fp32 bits).
  const bool bf16 = request.arg == kBf16;
  float a[16][16], b[16][8], c[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const uint32_t* w = in[l];
    const int a_rows[4] = {g, g + 8, g, g + 8};
    const int a_cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int r = 0; r < 4; ++r) {
      a[a_rows[r]][a_cols[r]] = half_to_float(low(w[r]), bf16);
      a[a_rows[r]][a_cols[r] + 1] = half_to_float(high(w[r]), bf16);
    }
    for (int r = 0; r < 2; ++r) {
      b[2 * t + 8 * r][g] = half_to_float(low(w[4 + r]), bf16);
      b[2 * t + 8 * r + 1][g] = half_to_float(high(w[4 + r]), bf16);
    }
    for (int r = 0; r < 4; ++r) {
      std::memcpy(&c[g + 8 * (r / 2)][2 * t + r % 2], &w[6 + r], 4);
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
      float acc = 0.0f;
      for (int k = 0; k < 16; ++k) acc = std::fma(a[row][k], b[k][col], acc);
      const float d = acc + c[row][col];
      std::memcpy(&out[l][r], &d, 4);
    }
  }
}

}  // namespace detail

void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row, bool trans, Where where) {
  uint32_t addr[2] = {};
  const uintptr_t p = reinterpret_cast<uintptr_t>(smem_row);
  std::memcpy(addr, &p, sizeof(p));
  if (p % 16 != 0) detail::fault("ldmatrix: row address not 16-byte aligned", where);
  detail::require_shared(smem_row, 16, "ldmatrix", where);
  detail::warp_collective(
      {detail::WarpOp::kLdmatrix, 0xffffffffu, trans ? kTrans : 0, 32, addr, 2, r, 4}, where);
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                  const float (&c)[4], bool bf16, Where where) {
  uint32_t in[10];
  std::memcpy(in, a, 16);
  std::memcpy(in + 4, b, 8);
  std::memcpy(in + 6, c, 16);
  uint32_t result[4];
  detail::warp_collective(
      {detail::WarpOp::kMma, 0xffffffffu, bf16 ? kBf16 : 0, 32, in, 10, result, 4}, where);
  std::memcpy(d, result, 16);
}

}  // namespace cuemu
