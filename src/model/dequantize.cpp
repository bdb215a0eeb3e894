#include "strata/model/dequantize.h"

#include <cstring>
#include <optional>
#include <string>

#include "strata/common/check.h"

// The formulas below are evaluated as written, one rounding per operation; contracting
// `d * q + m` into an FMA would change low bits. GCC leaves contraction off in ISO C++ mode
// (CMAKE_CXX_EXTENSIONS OFF); clang needs the pragma.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace strata::model {
namespace {

constexpr int64_t kBlockElements = 32;        // Q4_0 .. Q8_0
constexpr int64_t kSuperBlockElements = 256;  // K-quants

// Unaligned little-endian loads (memcpy compiles to a plain load).
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline float load_fp16(const uint8_t* p) { return fp16_to_float(load_u16(p)); }

void dequantize_f16(const uint8_t* src, int64_t num_elements, float* dst) {
  for (int64_t i = 0; i < num_elements; ++i) dst[i] = fp16_to_float(load_u16(src + 2 * i));
}

void dequantize_bf16(const uint8_t* src, int64_t num_elements, float* dst) {
  for (int64_t i = 0; i < num_elements; ++i) dst[i] = bf16_to_float(load_u16(src + 2 * i));
}

// {f16 d; i8 qs[32]}
void dequantize_q8_0(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 34, dst += kBlockElements) {
    const float d = load_fp16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(static_cast<int8_t>(qs[j]));
  }
}

// {f16 d; u8 qs[16]}
void dequantize_q4_0(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 18, dst += kBlockElements) {
    const float d = load_fp16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
      dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

// {f16 d, m; u8 qs[16]}
void dequantize_q4_1(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 20, dst += kBlockElements) {
    const float d = load_fp16(src);
    const float m = load_fp16(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
      dst[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
}

// {f16 d; u8 qh[4]; u8 qs[16]}
void dequantize_q5_0(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 22, dst += kBlockElements) {
    const float d = load_fp16(src);
    const uint32_t qh = load_u32(src + 2);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = d * static_cast<float>(lo - 16);
      dst[j + 16] = d * static_cast<float>(hi - 16);
    }
  }
}

// {f16 d, m; u8 qh[4]; u8 qs[16]}
void dequantize_q5_1(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 24, dst += kBlockElements) {
    const float d = load_fp16(src);
    const float m = load_fp16(src + 2);
    const uint32_t qh = load_u32(src + 4);
    const uint8_t* qs = src + 8;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = d * static_cast<float>(lo) + m;
      dst[j + 16] = d * static_cast<float>(hi) + m;
    }
  }
}

// Per-sub-block multipliers of a Q4_K/Q5_K super-block: y = scale[s] * q - min[s].
struct KSubBlockScales {
  float scale[8];  // d * sc[s]
  float min[8];    // dmin * mn[s]
};

// Unpacks the 12-byte field holding eight 6-bit scales and eight 6-bit mins (layout in the header).
KSubBlockScales unpack_k_scales(float d, float dmin, const uint8_t* scales) {
  KSubBlockScales out;
  for (int s = 0; s < 4; ++s) {
    out.scale[s] = d * static_cast<float>(scales[s] & 63);
    out.min[s] = dmin * static_cast<float>(scales[s + 4] & 63);
  }
  for (int s = 4; s < 8; ++s) {
    const int sc = (scales[s + 4] & 0x0f) | ((scales[s - 4] >> 6) << 4);
    const int mn = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
    out.scale[s] = d * static_cast<float>(sc);
    out.min[s] = dmin * static_cast<float>(mn);
  }
  return out;
}

// {f16 d, dmin; u8 scales[12]; u8 qs[128]}
void dequantize_q4_k(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 144, dst += kSuperBlockElements) {
    const KSubBlockScales k = unpack_k_scales(load_fp16(src), load_fp16(src + 2), src + 4);
    const uint8_t* qs = src + 16;
    for (int c = 0; c < 4; ++c, qs += 32) {
      float* y = dst + 64 * c;
      const float scale_lo = k.scale[2 * c], min_lo = k.min[2 * c];
      const float scale_hi = k.scale[2 * c + 1], min_hi = k.min[2 * c + 1];
      for (int l = 0; l < 32; ++l) {
        y[l] = scale_lo * static_cast<float>(qs[l] & 0x0f) - min_lo;
        y[l + 32] = scale_hi * static_cast<float>(qs[l] >> 4) - min_hi;
      }
    }
  }
}

// {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
void dequantize_q5_k(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 176, dst += kSuperBlockElements) {
    const KSubBlockScales k = unpack_k_scales(load_fp16(src), load_fp16(src + 2), src + 4);
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int c = 0; c < 4; ++c, qs += 32) {
      float* y = dst + 64 * c;
      const float scale_lo = k.scale[2 * c], min_lo = k.min[2 * c];
      const float scale_hi = k.scale[2 * c + 1], min_hi = k.min[2 * c + 1];
      const int shift_lo = 2 * c, shift_hi = 2 * c + 1;
      for (int l = 0; l < 32; ++l) {
        const int lo = (qs[l] & 0x0f) | (((qh[l] >> shift_lo) & 1) << 4);
        const int hi = (qs[l] >> 4) | (((qh[l] >> shift_hi) & 1) << 4);
        y[l] = scale_lo * static_cast<float>(lo) - min_lo;
        y[l + 32] = scale_hi * static_cast<float>(hi) - min_hi;
      }
    }
  }
}

// {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
void dequantize_q6_k(const uint8_t* src, int64_t num_blocks, float* dst) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 210, dst += kSuperBlockElements) {
    const float d = load_fp16(src + 208);
    float group_scale[16];  // d * scales[g] for the 16-element group g
    for (int g = 0; g < 16; ++g) {
      group_scale[g] = d * static_cast<float>(static_cast<int8_t>(src[192 + g]));
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + 128 + 32 * h;
      const float* sc = group_scale + 8 * h;
      float* y = dst + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int g = l / 16;
        const int q0 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = sc[g] * static_cast<float>(q0);
        y[l + 32] = sc[g + 2] * static_cast<float>(q1);
        y[l + 64] = sc[g + 4] * static_cast<float>(q2);
        y[l + 96] = sc[g + 6] * static_cast<float>(q3);
      }
    }
  }
}

// Codes and group maps of the 4-bit types: y = scale[g] * q + offset[g] per 32 elements.
void decode_q4_0(const uint8_t* src, int64_t num_blocks, uint8_t* q, float* scale, float* offset) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 18, q += kBlockElements) {
    const float d = load_fp16(src);
    scale[b] = d;
    offset[b] = -8.0f * d;
    for (int j = 0; j < 16; ++j) {
      q[j] = src[2 + j] & 0x0f;
      q[j + 16] = src[2 + j] >> 4;
    }
  }
}

void decode_q4_1(const uint8_t* src, int64_t num_blocks, uint8_t* q, float* scale, float* offset) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 20, q += kBlockElements) {
    scale[b] = load_fp16(src);
    offset[b] = load_fp16(src + 2);
    for (int j = 0; j < 16; ++j) {
      q[j] = src[4 + j] & 0x0f;
      q[j + 16] = src[4 + j] >> 4;
    }
  }
}

void decode_q4_k(const uint8_t* src, int64_t num_blocks, uint8_t* q, float* scale, float* offset) {
  for (int64_t b = 0; b < num_blocks; ++b, src += 144, q += kSuperBlockElements) {
    const KSubBlockScales k = unpack_k_scales(load_fp16(src), load_fp16(src + 2), src + 4);
    for (int s = 0; s < 8; ++s) {
      scale[8 * b + s] = k.scale[s];
      offset[8 * b + s] = -k.min[s];
    }
    const uint8_t* qs = src + 16;
    for (int c = 0; c < 4; ++c, qs += 32) {
      for (int l = 0; l < 32; ++l) {
        q[64 * c + l] = qs[l] & 0x0f;
        q[64 * c + l + 32] = qs[l] >> 4;
      }
    }
  }
}

// INVALID_ARGUMENT unless num_elements is a non-negative multiple of the type's blocks.
Status check_whole_blocks(const GgmlTypeInfo& info, int64_t num_elements, const char* caller) {
  if (num_elements < 0 || num_elements % info.block_elements != 0) {
    return invalid_argument_error(std::string(caller) + ": " + std::to_string(num_elements) +
                                  " elements of type " + std::string(info.name) +
                                  " is not a whole number of " +
                                  std::to_string(info.block_elements) + "-element blocks");
  }
  return Status::ok_status();
}

}  // namespace

Status dequantize_row(GgmlType type, const void* src, int64_t num_elements, float* dst) {
  const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(type));
  if (!info) {
    return unimplemented_error("dequantize_row: unknown ggml type id " +
                               std::to_string(static_cast<uint32_t>(type)));
  }
  if (!info->dequantize_supported) {
    return unimplemented_error("dequantize_row: dequantization of type " + std::string(info->name) +
                               " is not supported");
  }
  STRATA_RETURN_IF_ERROR(check_whole_blocks(*info, num_elements, "dequantize_row"));
  if (num_elements == 0) return Status::ok_status();
  STRATA_CHECK(src != nullptr && dst != nullptr) << "dequantize_row: null buffer";

  const auto* bytes = static_cast<const uint8_t*>(src);
  const int64_t num_blocks = num_elements / info->block_elements;
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, bytes, static_cast<size_t>(num_elements) * sizeof(float));
      break;
    case GgmlType::kF16:
      dequantize_f16(bytes, num_elements, dst);
      break;
    case GgmlType::kBF16:
      dequantize_bf16(bytes, num_elements, dst);
      break;
    case GgmlType::kQ8_0:
      dequantize_q8_0(bytes, num_blocks, dst);
      break;
    case GgmlType::kQ4_0:
      dequantize_q4_0(bytes, num_blocks, dst);
      break;
    case GgmlType::kQ4_1:
      dequantize_q4_1(bytes, num_blocks, dst);
      break;
    case GgmlType::kQ5_0:
      dequantize_q5_0(bytes, num_blocks, dst);
      break;
    case GgmlType::kQ5_1:
      dequantize_q5_1(bytes, num_blocks, dst);
      break;
    case GgmlType::kQ4_K:
      dequantize_q4_k(bytes, num_blocks, dst);
      break;
    case GgmlType::kQ5_K:
      dequantize_q5_k(bytes, num_blocks, dst);
      break;
    case GgmlType::kQ6_K:
      dequantize_q6_k(bytes, num_blocks, dst);
      break;
    default:
      // ggml_type_info() marked the type supported but no kernel is wired up here.
      STRATA_CHECK(false) << "dequantize_row: no implementation for supported type " << info->name;
  }
  return Status::ok_status();
}

bool has_int4_codes(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ4_K;
}

Status decode_int4_codes(GgmlType type, const void* src, int64_t num_elements, uint8_t* codes,
                         float* scale, float* offset) {
  if (!has_int4_codes(type)) {
    return unimplemented_error("decode_int4_codes: type " + std::string(ggml_type_name(type)) +
                               " is not a 4-bit block type");
  }
  const GgmlTypeInfo info = *ggml_type_info(static_cast<uint32_t>(type));
  STRATA_RETURN_IF_ERROR(check_whole_blocks(info, num_elements, "decode_int4_codes"));
  if (num_elements == 0) return Status::ok_status();
  STRATA_CHECK(src != nullptr && codes != nullptr && scale != nullptr && offset != nullptr)
      << "decode_int4_codes: null buffer";
  const auto* bytes = static_cast<const uint8_t*>(src);
  const int64_t num_blocks = num_elements / info.block_elements;
  switch (type) {
    case GgmlType::kQ4_0:
      decode_q4_0(bytes, num_blocks, codes, scale, offset);
      break;
    case GgmlType::kQ4_1:
      decode_q4_1(bytes, num_blocks, codes, scale, offset);
      break;
    default:
      decode_q4_k(bytes, num_blocks, codes, scale, offset);
      break;
  }
  return Status::ok_status();
}

}  // namespace strata::model
