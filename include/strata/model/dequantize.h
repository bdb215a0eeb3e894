// CPU dequantization of GGML tensor data (plain float and block-quantized types) into float32.
//
// All multi-byte fields are little-endian, as in GGUF files; the host must be little-endian too
// (checked at compile time). Source data needs no alignment: GGML blocks are packed back to back,
// so their f16 fields fall on odd offsets anyway.
//
// Block layouts handled by dequantize_row(), one block after another, `d`/`m`/`dmin` are IEEE
// binary16, q is the stored unsigned integer of the stated width unless said otherwise:
//
//   F32   one float32 per element.
//   F16   one binary16 per element.
//   BF16  one bfloat16 per element (the high half of a float32).
//   Q8_0  32 elems, 34 B: {f16 d; i8 qs[32]}                    y[j] = d * qs[j]
//   Q4_0  32 elems, 18 B: {f16 d; u8 qs[16]}                    y[j] = d * (q[j] - 8)
//   Q4_1  32 elems, 20 B: {f16 d, m; u8 qs[16]}                 y[j] = d * q[j] + m
//         4-bit q: elements 0..15 are the low nibbles of qs[0..15], 16..31 the high nibbles.
//   Q5_0  32 elems, 22 B: {f16 d; u8 qh[4]; u8 qs[16]}          y[j] = d * (q[j] - 16)
//   Q5_1  32 elems, 24 B: {f16 d, m; u8 qh[4]; u8 qs[16]}       y[j] = d * q[j] + m
//         5-bit q: low 4 bits as for Q4_x; bit 4 of element j is bit j of the u32 qh.
//   Q4_K  256 elems, 144 B: {f16 d, dmin; u8 scales[12]; u8 qs[128]}
//   Q5_K  256 elems, 176 B: {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
//         8 sub-blocks of 32, each with a 6-bit scale sc[s] and 6-bit min mn[s] packed in scales:
//           s < 4:  sc = scales[s] & 63,  mn = scales[s + 4] & 63
//           s >= 4: sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4
//                   mn = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4
//         Sub-blocks 2c and 2c+1 (c = 0..3) take the low and high nibbles of qs[32c .. 32c+31];
//         for Q5_K, bit 4 of element l of sub-block s is bit s of qh[l].
//         y = (d * sc[s]) * q - (dmin * mn[s]).
//   Q6_K  256 elems, 210 B: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
//         Two halves of 128 (h = 0, 1) use ql[64h ..], qh[32h ..]; within a half, for l = 0..31,
//         elements l, l+32, l+64, l+96 take the low nibble of ql[l], the low nibble of ql[l+32],
//         the high nibble of ql[l], the high nibble of ql[l+32] as bits 0-3 and bit pairs 0-1,
//         2-3, 4-5, 6-7 of qh[l] as bits 4-5. Element e of the block uses scales[e / 16];
//         y = (d * scales[e / 16]) * (q - 32).
//
// Arithmetic is float32 in exactly the order written above (no fused multiply-add), so results
// are reproducible bit for bit across builds and match other float32 implementations that follow
// the formats (gguf-py, ggml without FMA contraction).
#pragma once

#include <bit>
#include <cstdint>

#include "strata/common/status.h"
#include "strata/model/ggml_types.h"

namespace strata::model {

static_assert(std::endian::native == std::endian::little,
              "GGML data is little-endian; dequantization assumes a little-endian host");

// IEEE binary16 bits -> float32. Exact for every input: subnormals become normal floats, +-0 and
// +-inf keep their sign, NaNs stay NaN (payload shifted into the high mantissa bits).
inline float fp16_to_float(uint16_t bits) {
  // Branch-free so that loops over F16 data vectorise.
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(bits & 0x7fffu) << 13;  // exponent+mantissa
  const uint32_t exponent = shifted & 0x0f800000u;
  uint32_t magnitude = shifted + (112u << 23);  // rebias 15 -> 127
  // Inf/NaN: exponent 31 -> 255, mantissa (NaN payload) kept.
  magnitude = exponent == 0x0f800000u ? magnitude + (112u << 23) : magnitude;
  // Zero/subnormal: mantissa * 2^-24, exact, computed as (1.mantissa * 2^-14) - 2^-14.
  const float subnormal = std::bit_cast<float>(shifted + (113u << 23)) - 0x1p-14f;
  magnitude = exponent == 0 ? std::bit_cast<uint32_t>(subnormal) : magnitude;
  return std::bit_cast<float>(sign | magnitude);
}

// bfloat16 bits -> float32. Exact for every input (bf16 is the top half of a float32).
inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Dequantizes `num_elements` consecutive values of `type` stored at `src` (the bytes of
// num_elements / block_elements whole blocks, laid out as above) into dst[0 .. num_elements).
//
// REQUIRES: src and dst non-null when num_elements > 0; the ranges do not overlap.
// Returns INVALID_ARGUMENT if num_elements is negative or not a multiple of the type's
// block_elements; UNIMPLEMENTED, naming the type, for types without dequantize support (see
// ggml_type_info().dequantize_supported) and for unknown type ids. dst is untouched on error.
// Thread-safe (pure function). Callers may parallelise by splitting a tensor at block boundaries:
// src advances by block_bytes for every block_elements values.
Status dequantize_row(GgmlType type, const void* src, int64_t num_elements, float* dst);

// The 4-bit block types as stored, for kernels that multiply with them directly: one code in
// [0, 16) per element (codes[j]) and one affine map per 32 elements, y[j] = scale[j / 32] *
// codes[j] + offset[j / 32]. Q4_0: scale d, offset -8d; Q4_1: d, m; Q4_K: d * sc[s], -dmin * mn[s].
// Equal to dequantize_row() up to float rounding (the map is applied in one order for all three)
// wherever the block's d and dmin are finite.
//
// REQUIRES: buffers of num_elements codes and num_elements / 32 scales and offsets.
// UNIMPLEMENTED unless has_int4_codes(type); INVALID_ARGUMENT as dequantize_row(). Thread-safe.
bool has_int4_codes(GgmlType type);
constexpr int64_t kInt4CodeGroup = 32;
Status decode_int4_codes(GgmlType type, const void* src, int64_t num_elements, uint8_t* codes,
                         float* scale, float* offset);

}  // namespace strata::model
