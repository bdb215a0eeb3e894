// Regex pre-tokenizer: a sequence of PCRE2 patterns, each splitting every piece produced by the
// previous one into matches and the gaps between them (HF Split with behavior "Isolated", and
// llama.cpp's unicode_regex_split). Patterns use the Oniguruma dialect of HF tokenizers
// (\p{L}, \p{N}, (?i:...), lookahead), compiled with PCRE2_UTF | PCRE2_UCP.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"

namespace strata::tokenizer::detail {

// `pattern` with \s and \S spelled as explicit Unicode White_Space classes, so that PCRE2 agrees
// with Oniguruma (PCRE2 also counts U+180E as a space). UNIMPLEMENTED for \S inside a class.
StatusOr<std::string> rewrite_whitespace_classes(std::string_view pattern);

// `text` as a PCRE2 pattern matching it literally.
std::string escape_regex_literal(std::string_view text);

// Immutable after create(); split() is const and thread-safe.
class PreTokenizer {
 public:
  // INVALID_ARGUMENT naming the pattern and PCRE2's message if one does not compile. An empty
  // list is valid (no splitting).
  static StatusOr<std::unique_ptr<PreTokenizer>> create(const std::vector<std::string>& patterns);
  ~PreTokenizer();

  // Replaces *pieces with the non-empty pieces of `text`, in order; they are views into `text`
  // and concatenate to it. REQUIRES: `text` is valid UTF-8 (not re-checked).
  void split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  struct Impl;
  explicit PreTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::tokenizer::detail
