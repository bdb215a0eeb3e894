// Element types: the one enum for what a weight, an activation or a KV page element is, used by
// the config (model.dtype), the executor (compute dtype), the kernels' launchers and the KV page
// formats (kv/kv_types.h). Plain header: CUDA and emulator builds include it too.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class DType : uint8_t {
  kFloat32,
  kBFloat16,
  kFloat16,
  kFloat8E4M3,  // OCP e4m3fn (max 448), scaled per group in KV pages
  kInt8,        // integers hold min-max quantized values: x = q * scale + zero
  kInt4,        // two per byte, the first in the low nibble
  kInt2,        // four per byte, the first in the lowest two bits
};

constexpr int dtype_bits(DType t) {
  switch (t) {
    case DType::kFloat32: return 32;
    case DType::kBFloat16:
    case DType::kFloat16: return 16;
    case DType::kFloat8E4M3:
    case DType::kInt8: return 8;
    case DType::kInt4: return 4;
    case DType::kInt2: return 2;
  }
  return 0;
}

// fp32, bf16 and fp16 are stored as they are; the others need a scale (and integers a zero).
constexpr bool dtype_is_quantized(DType t) { return dtype_bits(t) <= 8; }
constexpr bool dtype_has_zero_point(DType t) { return dtype_is_quantized(t) && t != DType::kFloat8E4M3; }

// "float32" | "bfloat16" | "float16" | "float8_e4m3" | "int8" | "int4" | "int2".
constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat8E4M3: return "float8_e4m3";
    case DType::kInt8: return "int8";
    case DType::kInt4: return "int4";
    case DType::kInt2: return "int2";
  }
  return "?";
}

// dtype_name() spellings, and fp32 / bf16 / fp16 / fp8; nullopt for anything else.
constexpr std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3,
                  DType::kInt8, DType::kInt4, DType::kInt2}) {
    if (name == dtype_name(t)) return t;
  }
  if (name == "fp32") return DType::kFloat32;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "fp16") return DType::kFloat16;
  if (name == "fp8") return DType::kFloat8E4M3;
  return std::nullopt;
}

}  // namespace strata
