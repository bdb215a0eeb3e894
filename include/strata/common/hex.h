// 64-bit digests as files spell them (a model's content fingerprint in a `strata profile` file):
// 16 lowercase hex digits.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace strata {

inline std::string hex64(uint64_t value) {
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(value));
  return digits;
}

}  // namespace strata
