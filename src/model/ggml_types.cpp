#include "strata/model/ggml_types.h"

namespace strata::model {
namespace {

// Block geometry from ggml-common.h (the C structs are the source of truth for file layout).
// Q8_1 is 36 bytes ({f16 d, s; i8 qs[32]}); gguf-py's GGML_QUANT_SIZES still says 40, the size of
// the old float-scaled struct. Q8_1 and Q8_K are in-memory dot-product formats that do not occur
// in model files, but their ids are valid, so they are described here.
std::optional<GgmlTypeInfo> info_of(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return GgmlTypeInfo{"F32", 1, 4, true};
    case GgmlType::kF16:
      return GgmlTypeInfo{"F16", 1, 2, true};
    case GgmlType::kQ4_0:
      return GgmlTypeInfo{"Q4_0", 32, 18, true};
    case GgmlType::kQ4_1:
      return GgmlTypeInfo{"Q4_1", 32, 20, true};
    case GgmlType::kQ5_0:
      return GgmlTypeInfo{"Q5_0", 32, 22, true};
    case GgmlType::kQ5_1:
      return GgmlTypeInfo{"Q5_1", 32, 24, true};
    case GgmlType::kQ8_0:
      return GgmlTypeInfo{"Q8_0", 32, 34, true};
    case GgmlType::kQ8_1:
      return GgmlTypeInfo{"Q8_1", 32, 36, false};
    case GgmlType::kQ2_K:
      return GgmlTypeInfo{"Q2_K", 256, 84, false};
    case GgmlType::kQ3_K:
      return GgmlTypeInfo{"Q3_K", 256, 110, false};
    case GgmlType::kQ4_K:
      return GgmlTypeInfo{"Q4_K", 256, 144, true};
    case GgmlType::kQ5_K:
      return GgmlTypeInfo{"Q5_K", 256, 176, true};
    case GgmlType::kQ6_K:
      return GgmlTypeInfo{"Q6_K", 256, 210, true};
    case GgmlType::kQ8_K:
      return GgmlTypeInfo{"Q8_K", 256, 292, false};
    case GgmlType::kBF16:
      return GgmlTypeInfo{"BF16", 1, 2, true};
  }
  return std::nullopt;
}

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id) {
  return info_of(static_cast<GgmlType>(type_id));
}

std::string_view ggml_type_name(GgmlType type) {
  const std::optional<GgmlTypeInfo> info = info_of(type);
  return info ? info->name : std::string_view("unknown");
}

}  // namespace strata::model
