#include "lexer.h"

#include <cctype>
#include <cstring>

#include "../utf8.h"
#include "value.h"

namespace strata::tokenizer::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(source) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t open = find_tag(pos_);
      std::string text(src_.substr(pos_, open - pos_));
      if (open == src_.size()) {
        emit_text(std::move(text));
        pos_ = open;
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the line's leading spaces/tabs when only they precede the tag.
        const size_t nl = text.rfind('\n');
        const size_t line_begin = nl == std::string::npos ? 0 : nl + 1;
        if (nl != std::string::npos || line_starting) {
          bool blank = true;
          for (size_t i = line_begin; i < text.size(); ++i) blank &= is_space(text[i]);
          if (blank) text.resize(line_begin);
        }
      }
      emit_text(std::move(text));
      advance_to(open + 2 + (sign == '-' || sign == '+' ? 1 : 0));
      if (kind == '#') {
        line_starting = lex_comment();
      } else if (kind == '{') {
        tokens_.push_back({Tok::kVarBegin, "", 0, 0, line_});
        lex_inside(Tok::kVarEnd);
        line_starting = false;
      } else if (is_raw_block()) {
        line_starting = lex_raw();
      } else {
        tokens_.push_back({Tok::kBlockBegin, "", 0, 0, line_});
        line_starting = lex_inside(Tok::kBlockEnd);
      }
    }
    tokens_.push_back({Tok::kEof, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void advance_to(size_t to) {
    for (; pos_ < to; ++pos_) line_ += src_[pos_] == '\n';
  }

  void emit_text(std::string text) {
    if (!text.empty()) tokens_.push_back({Tok::kText, std::move(text), 0, 0, line_});
  }

  // After a tag's closing delimiter at pos_ (already past it): "-" stripped all whitespace,
  // trim_blocks drops one newline. Returns whether the consumed text ends a line.
  bool finish_tag(char sign, bool trim) {
    if (sign == '-') {
      size_t end = pos_;
      while (end < src_.size() && is_space(src_[end])) ++end;
      const bool newline = end > pos_ && src_[end - 1] == '\n';
      advance_to(end);
      return newline;
    }
    if (trim && sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      return true;
    }
    return false;
  }

  bool lex_comment() {
    const size_t close = src_.find("#}", pos_);
    if (close == std::string_view::npos) syntax_error(line_, "unclosed comment");
    const char sign =
        close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : '\0';
    advance_to(close + 2);
    return finish_tag(sign, true);
  }

  bool is_raw_block() const {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  bool lex_raw() {
    const size_t close = src_.find("%}", pos_);
    const char sign = src_[close - 1] == '-' ? '-' : '\0';
    advance_to(close + 2);
    finish_tag(sign, true);
    // The body runs to the {% endraw %} tag.
    size_t search = pos_;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string_view::npos) syntax_error(line_, "missing endraw");
      size_t p = open + 2 + (src_[open + 2] == '-' || src_[open + 2] == '+');
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      std::string body(src_.substr(pos_, open - pos_));
      if (src_[open + 2] == '-') {
        while (!body.empty() && is_space(body.back())) body.pop_back();
      }
      emit_text(std::move(body));
      const size_t end = src_.find("%}", p);
      if (end == std::string_view::npos) syntax_error(line_, "unclosed endraw tag");
      const char end_sign = src_[end - 1] == '-' ? '-' : '\0';
      advance_to(end + 2);
      return finish_tag(end_sign, true);
    }
  }

  // Lexes expression tokens up to the end delimiter; returns whether the tag ended a line.
  bool lex_inside(Tok end_type) {
    const char* end = end_type == Tok::kVarEnd ? "}}" : "%}";
    int depth = 0;  // open ( [ { : the end delimiter only counts outside them, as in Jinja2
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) syntax_error(line_, std::string("missing '") + end + "'");
      if (depth == 0) {
        for (char sign : {'-', '+', '\0'}) {
          const size_t at = pos_ + (sign ? 1 : 0);
          if ((sign == 0 || src_[pos_] == sign) && src_.compare(at, 2, end) == 0) {
            advance_to(at + 2);
            tokens_.push_back({end_type, "", 0, 0, line_});
            return finish_tag(sign, end_type == Tok::kBlockEnd);
          }
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
          ++e;
        }
        tokens_.push_back({Tok::kName, std::string(src_.substr(pos_, e - pos_)), 0, 0, line_});
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                           "{",  "}",  ",",  ".",  ":",  "|",  "="};
        const char* op = nullptr;
        for (const char* candidate : kOps) {
          if (src_.compare(pos_, std::strlen(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (!op) syntax_error(line_, std::string("unexpected character '") + c + "'");
        if (*op == '(' || *op == '[' || *op == '{') ++depth;
        if ((*op == ')' || *op == ']' || *op == '}') && depth > 0) --depth;
        tokens_.push_back({Tok::kOp, op, 0, 0, line_});
        advance_to(pos_ + std::strlen(op));
      }
    }
  }

  void lex_number() {
    size_t e = pos_;
    bool is_float = false;
    std::string digits;
    auto take_digits = [&] {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
        if (src_[e] != '_') digits.push_back(src_[e]);
        ++e;
      }
    };
    take_digits();
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      digits.push_back('.');
      ++e;
      take_digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        is_float = true;
        digits.append(src_.substr(e, x - e));
        e = x;
        take_digits();
      }
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, digits, 0, 0, line_};
    if (is_float) {
      t.float_value = std::stod(digits);
    } else {
      t.int_value = std::stoll(digits);
    }
    tokens_.push_back(std::move(t));
    advance_to(e);
  }

  // A Python string literal; escapes are decoded as Python's unicode_escape does.
  void lex_string(char quote) {
    std::string value;
    size_t e = pos_ + 1;
    while (true) {
      if (e >= src_.size()) syntax_error(line_, "unterminated string literal");
      const char c = src_[e];
      if (c == quote) break;
      if (c != '\\' || e + 1 >= src_.size()) {
        value.push_back(c);
        ++e;
        continue;
      }
      const char n = src_[e + 1];
      e += 2;
      switch (n) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case '0':
          value.push_back('\0');
          break;
        case '\\':
        case '\'':
        case '"':
          value.push_back(n);
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t width = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          if (e + width > src_.size()) syntax_error(line_, "truncated \\x/\\u escape");
          const uint32_t cp =
              static_cast<uint32_t>(std::stoul(std::string(src_.substr(e, width)), nullptr, 16));
          e += width;
          detail::append_utf8(cp, &value);
          break;
        }
        default:
          value.push_back('\\');
          value.push_back(n);
      }
    }
    tokens_.push_back({Tok::kString, std::move(value), 0, 0, line_});
    advance_to(e + 1);
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

void syntax_error(int line, const std::string& message) {
  throw TemplateError("template syntax error at line " + std::to_string(line) + ": " + message);
}

std::vector<Token> lex_template(std::string_view source) { return Lexer(source).run(); }

}  // namespace strata::tokenizer::jinja
