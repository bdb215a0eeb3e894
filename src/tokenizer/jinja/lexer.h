// Tokens of a Jinja template (lexer.cpp): template text with Jinja2's whitespace control already
// applied, tag delimiters, and the expression tokens inside tags.
//
// Whitespace is handled as Jinja2 does with trim_blocks and lstrip_blocks on (transformers'
// environment): a newline right after a block or comment tag is dropped, spaces and tabs from the
// start of a line to a block or comment tag are dropped, "-" on a tag strips all whitespace on
// that side and "+" disables lstrip / trim for the tag.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tokenizer::jinja {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // text, name, operator, or the string literal's value
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Throws TemplateError("template syntax error at line N: ...").
[[noreturn]] void syntax_error(int line, const std::string& message);

// The tokens of `source`, ending with kEof. TemplateError for unterminated tags and literals.
std::vector<Token> lex_template(std::string_view source);

}  // namespace strata::tokenizer::jinja
