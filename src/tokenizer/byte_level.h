// GPT-2 byte-level alphabet: every byte is shown as one printable code point (space -> "Ġ",
// newline -> "Ċ", ...), so BPE vocabularies are strings of those characters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::tokenizer::detail {

// UTF-8 text of the code point byte `b` is shown as.
std::string_view byte_to_chars(uint8_t b);

// Byte-character form of raw `bytes` (each byte replaced by byte_to_chars(byte)).
std::string byte_level_encode(std::string_view bytes);

// Raw bytes of a byte-character string; nullopt if `text` contains a code point outside the
// alphabet (or is not valid UTF-8). HF's ByteLevel decoder then keeps the token text as is.
std::optional<std::string> byte_level_decode(std::string_view text);

}  // namespace strata::tokenizer::detail
