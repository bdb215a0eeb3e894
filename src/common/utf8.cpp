#include "strata/common/utf8.h"

#include <cstdint>

namespace strata {

Utf8Sequence classify_utf8_sequence(std::string_view bytes, size_t* length) {
  const auto b0 = static_cast<uint8_t>(bytes[0]);
  size_t num_continuation = 0;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 < 0x80) {
    *length = 1;
    return Utf8Sequence::kValid;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    num_continuation = 1;
  } else if (b0 == 0xE0) {
    num_continuation = 2;
    lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    num_continuation = 2;
  } else if (b0 == 0xED) {
    num_continuation = 2;
    hi = 0x9F;  // excludes surrogates
  } else if (b0 == 0xF0) {
    num_continuation = 3;
    lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    num_continuation = 3;
  } else if (b0 == 0xF4) {
    num_continuation = 3;
    hi = 0x8F;  // <= U+10FFFF
  } else {
    *length = 1;
    return Utf8Sequence::kInvalid;
  }
  for (size_t k = 1; k <= num_continuation; ++k) {
    if (k >= bytes.size()) {
      *length = k;
      return Utf8Sequence::kIncomplete;
    }
    const auto c = static_cast<uint8_t>(bytes[k]);
    if (c < lo || c > hi) {
      *length = k;
      return Utf8Sequence::kInvalid;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  *length = num_continuation + 1;
  return Utf8Sequence::kValid;
}

bool is_valid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t length = 0;
    if (classify_utf8_sequence(bytes.substr(pos), &length) != Utf8Sequence::kValid) return false;
    pos += length;
  }
  return true;
}

}  // namespace strata
