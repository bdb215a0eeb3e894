#include "pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "strata/common/check.h"

namespace strata::tokenizer::detail {
namespace {

// Unicode White_Space as class items (see is_unicode_whitespace()).
constexpr std::string_view kWhiteSpaceItems =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
using CodePtr = std::unique_ptr<pcre2_code, CodeDeleter>;
using MatchDataPtr = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

std::string pcre2_error_message(int error_code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(error_code)
               : std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

// Byte length of the UTF-8 sequence whose lead byte is `b` (1 for anything unexpected).
size_t sequence_length(uint8_t b) { return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1; }

}  // namespace

StatusOr<std::string> rewrite_whitespace_classes(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  bool at_class_start = false;  // a ']' here is a literal, not the end of the class
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[i + 1];
      at_class_start = false;
      if (d == 's') {
        if (in_class) {
          out.append(kWhiteSpaceItems);
        } else {
          out.append("[").append(kWhiteSpaceItems).append("]");
        }
      } else if (d == 'S') {
        if (in_class) {
          return unimplemented_error("pre-tokenizer pattern uses \\S inside a character class: " +
                                     std::string(pattern));
        }
        out.append("[^").append(kWhiteSpaceItems).append("]");
      } else if (d == 'Q') {  // \Q...\E quotes everything up to \E verbatim
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop;
        continue;
      } else {
        out.push_back(c);
        out.push_back(d);
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:]
        const size_t end = pattern.find(":]", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop;
        at_class_start = false;
        continue;
      }
      if (c == ']' && !at_class_start) in_class = false;
      at_class_start = false;
      out.push_back(c);
      ++i;
      continue;
    }
    out.push_back(c);
    ++i;
    if (c == '[') {
      in_class = true;
      at_class_start = true;
      if (i < pattern.size() && pattern[i] == '^') {
        out.push_back('^');
        ++i;
      }
    }
  }
  return out;
}

std::string escape_regex_literal(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

struct PreTokenizer::Impl {
  std::vector<std::string> patterns;  // as given, for messages
  std::vector<CodePtr> codes;         // [patterns.size()], applied in order
};

PreTokenizer::PreTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PreTokenizer::~PreTokenizer() = default;

StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::create(
    const std::vector<std::string>& patterns) {
  auto impl = std::make_unique<Impl>();
  for (const std::string& pattern : patterns) {
    STRATA_ASSIGN_OR_RETURN(const std::string rewritten, rewrite_whitespace_classes(pattern));
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    CodePtr code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                               PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr));
    if (code == nullptr) {
      return invalid_argument_error("pre-tokenizer pattern '" + pattern +
                                    "' does not compile: " + pcre2_error_message(error_code) +
                                    " at offset " + std::to_string(error_offset));
    }
    // JIT is an optimisation only: without it pcre2_match() interprets the pattern.
    pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
    impl->patterns.push_back(pattern);
    impl->codes.push_back(std::move(code));
  }
  return std::unique_ptr<PreTokenizer>(new PreTokenizer(std::move(impl)));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>* pieces) const {
  pieces->clear();
  if (text.empty()) return;
  pieces->push_back(text);
  std::vector<std::string_view> next;
  for (size_t step = 0; step < impl_->codes.size(); ++step) {
    const pcre2_code* code = impl_->codes[step].get();
    MatchDataPtr match_data(pcre2_match_data_create_from_pattern(code, nullptr));
    STRATA_CHECK(match_data != nullptr) << "out of memory creating PCRE2 match data";
    next.clear();
    for (std::string_view piece : *pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t start = 0;
      size_t gap_begin = 0;
      while (start < piece.size()) {
        const int rc = pcre2_match(code, subject, piece.size(), start, PCRE2_NO_UTF_CHECK,
                                   match_data.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        // Matching can only fail on resource limits, which these linear patterns do not reach.
        STRATA_CHECK(rc >= 0) << "pre-tokenizer pattern '" << impl_->patterns[step]
                              << "' failed on a " << piece.size()
                              << "-byte piece: " << pcre2_error_message(rc);
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
        const size_t match_begin = ovector[0];
        const size_t match_end = ovector[1];
        if (match_end == match_begin) {  // empty match: no piece, move on by one character
          if (match_begin >= piece.size()) break;
          start = match_begin + sequence_length(static_cast<uint8_t>(piece[match_begin]));
          continue;
        }
        if (match_begin > gap_begin)
          next.push_back(piece.substr(gap_begin, match_begin - gap_begin));
        next.push_back(piece.substr(match_begin, match_end - match_begin));
        start = gap_begin = match_end;
      }
      if (gap_begin < piece.size()) next.push_back(piece.substr(gap_begin));
    }
    pieces->swap(next);
  }
}

}  // namespace strata::tokenizer::detail
