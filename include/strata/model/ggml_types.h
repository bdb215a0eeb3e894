// GGML tensor element types as they appear in GGUF files, with their block geometry.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace strata::model {

// Values are the on-disk ids (ggml.h `enum ggml_type`); never renumber.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  std::string_view name;       // "Q4_K"
  int64_t block_elements;      // weights per block (1 for plain float types)
  int64_t block_bytes;         // bytes per block
  bool dequantize_supported;   // whether dequantize_row() handles it
};

// Geometry of a type id read from a file; nullopt for ids this build does not know.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id);
std::string_view ggml_type_name(GgmlType type);

}  // namespace strata::model
