#include "byte_level.h"

#include <array>

#include "utf8.h"

namespace strata::tokenizer::detail {
namespace {

// Code point of each byte, as in GPT-2's bytes_to_unicode(): printable Latin-1 bytes keep their
// value, the other 68 bytes take 256, 257, ... in byte order. All code points are < 324.
constexpr size_t kNumCodePoints = 324;

struct Tables {
  std::array<std::string, 256> chars;        // byte -> UTF-8 text
  std::array<int16_t, kNumCodePoints> byte;  // code point -> byte, -1 if not in the alphabet
};

const Tables& tables() {
  static const Tables kTables = [] {
    Tables t;
    t.byte.fill(-1);
    int next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp =
          printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next_extra++);
      append_utf8(cp, &t.chars[b]);
      t.byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return kTables;
}

}  // namespace

std::string_view byte_to_chars(uint8_t b) { return tables().chars[b]; }

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out.append(tables().chars[static_cast<uint8_t>(c)]);
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
  if (!is_valid_utf8(text)) return std::nullopt;
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    const char32_t cp = decode_code_point(text, pos, &len);
    if (cp >= kNumCodePoints || t.byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.byte[cp]));
    pos += len;
  }
  return out;
}

}  // namespace strata::tokenizer::detail
