// Identifiers shared across modules.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace strata {

// A vocabulary index. Kept a plain integer: token ids travel in large arrays to kernels and files.
using TokenId = int32_t;

// One generation stream (a request may own several). Strong type: never mixed up with counts.
struct SeqId {
  uint64_t value = 0;
  auto operator<=>(const SeqId&) const = default;
};

}  // namespace strata

template <>
struct std::hash<strata::SeqId> {
  size_t operator()(const strata::SeqId& id) const noexcept { return std::hash<uint64_t>{}(id.value); }
};
