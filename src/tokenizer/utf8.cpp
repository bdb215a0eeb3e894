#include "utf8.h"

#include "strata/common/utf8.h"

namespace strata::tokenizer::detail {

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_python_whitespace(char32_t cp) {
  return is_unicode_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F);
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t append_utf8_lossy(std::string_view bytes, bool final, std::string* out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t length = 0;
    switch (classify_utf8_sequence(bytes.substr(pos), &length)) {
      case Utf8Sequence::kValid:
        out->append(bytes.substr(pos, length));
        break;
      case Utf8Sequence::kInvalid:
        out->append(kReplacementChar);
        break;
      case Utf8Sequence::kIncomplete:
        if (!final) return pos;
        out->append(kReplacementChar);
        break;
    }
    pos += length;
  }
  return pos;
}

std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_utf8_lossy(bytes, /*final=*/true, &out);
  return out;
}

char32_t decode_code_point(std::string_view text, size_t pos, size_t* len) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + k]) & 0x3F);
  *len = n;
  return cp;
}

}  // namespace strata::tokenizer::detail
