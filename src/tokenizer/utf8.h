// UTF-8 helpers shared by the tokenizer: validation, lossy decoding with the same replacement rule
// as HF tokenizers (Rust String::from_utf8_lossy) and Python's errors="replace", code point access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/common/utf8.h"

namespace strata::tokenizer::detail {

// U+FFFD REPLACEMENT CHARACTER, UTF-8 encoded.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Unicode White_Space (25 code points): what Rust's char::is_whitespace and Oniguruma's \s accept.
bool is_unicode_whitespace(char32_t cp);

// Python str.isspace(), which Jinja's trim filter (str.strip) uses: White_Space minus nothing,
// plus U+001C..U+001F. Differs from is_unicode_whitespace only by those four.
bool is_python_whitespace(char32_t cp);

void append_utf8(char32_t cp, std::string* out);

using ::strata::is_valid_utf8;

// Appends `bytes` to `out` as valid UTF-8, replacing every maximal invalid subpart by U+FFFD
// (Unicode "substitution of maximal subparts"). If `final` is false, a trailing sequence that is
// incomplete but could still become valid is left unconsumed. Returns the number of bytes consumed.
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string* out);

// `bytes` with invalid sequences replaced (a copy, also when already valid).
std::string to_valid_utf8(std::string_view bytes);

// Decodes the code point starting at `pos` of valid UTF-8 `text`; sets *len to its byte length.
// REQUIRES: pos < text.size() and `text` valid UTF-8 from pos on.
char32_t decode_code_point(std::string_view text, size_t pos, size_t* len);

}  // namespace strata::tokenizer::detail
