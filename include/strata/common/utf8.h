// UTF-8 well-formedness (Unicode 15, table 3-7): what every front door and file parser accepts as
// text. The tokenizer's lossy decoding builds on classify_utf8_sequence.
#pragma once

#include <cstddef>
#include <string_view>

namespace strata {

enum class Utf8Sequence { kValid, kInvalid, kIncomplete };

// Classifies the sequence starting at bytes[0] (bytes non-empty). *length is the sequence length
// (kValid), the number of bytes forming the maximal invalid subpart (kInvalid, >= 1), or the bytes
// available (kIncomplete).
Utf8Sequence classify_utf8_sequence(std::string_view bytes, size_t* length);

// No overlong forms, surrogates, code points past U+10FFFF or truncated sequences.
bool is_valid_utf8(std::string_view bytes);

}  // namespace strata
