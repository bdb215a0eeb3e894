#include "yaml_text.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <cstdio>
#include <sstream>
#include <vector>

#include "strata/common/utf8.h"

namespace strata::config {
namespace {

// The code point of a valid UTF-8 sequence of `length` bytes.
char32_t code_point(std::string_view sequence, size_t length) {
  const auto byte = [&](size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(sequence[i]));
  };
  switch (length) {
    case 1:
      return byte(0);
    case 2:
      return (byte(0) & 0x1F) << 6 | (byte(1) & 0x3F);
    case 3:
      return (byte(0) & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F);
    default:
      return (byte(0) & 0x07) << 18 | (byte(1) & 0x3F) << 12 | (byte(2) & 0x3F) << 6 |
             (byte(3) & 0x3F);
  }
}

// YAML 1.2's c-printable: tab, line feed, carriage return, and every code point from U+0020 on
// but DEL, the C1 controls other than NEL, and U+FFFE / U+FFFF. yaml-cpp 0.7 reads other control
// characters raw into a scalar and writes them back escaped, so a file holding them changes on a
// round trip (found by fuzzing: a NUL in model.path).
bool yaml_printable(char32_t c) {
  if (c == 0x09 || c == 0x0A || c == 0x0D || c == 0x85) return true;
  if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) return false;
  return c != 0xFFFE && c != 0xFFFF;
}

// The first character a YAML file may not hold, if any: a byte that is not part of valid UTF-8,
// or a code point outside c-printable.
std::optional<YamlTextProblem> first_bad_character(std::string_view text) {
  YAML::Mark mark;
  mark.line = 0;
  mark.column = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t length = 0;
    if (classify_utf8_sequence(text.substr(pos), &length) != Utf8Sequence::kValid) {
      return YamlTextProblem{mark, "not valid UTF-8"};
    }
    if (const char32_t c = code_point(text.substr(pos), length); !yaml_printable(c)) {
      char name[16];
      std::snprintf(name, sizeof(name), "U+%04X", static_cast<unsigned>(c));
      return YamlTextProblem{mark, std::string("control character ") + name +
                                       " is not allowed in YAML (write it escaped in a "
                                       "double-quoted string)"};
    }
    if (text[pos] == '\n') {
      ++mark.line;
      mark.column = 0;
    } else {
      ++mark.column;
    }
    pos += length;
  }
  return std::nullopt;
}

// Where each YAML document starts.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

std::optional<YamlTextProblem> check_yaml_text(std::string_view text) {
  if (std::optional<YamlTextProblem> bad = first_bad_character(text)) return bad;
  std::istringstream stream{std::string(text)};
  YAML::Parser parser(stream);
  DocumentStarts documents;
  while (parser.HandleNextDocument(documents)) {
    const std::vector<YAML::Mark>& starts = documents.starts;
    if (starts.size() < 2) continue;
    // yaml-cpp 0.7's loop: a "document" that starts where the last one did consumed nothing.
    if (starts[0].pos == starts[1].pos) return YamlTextProblem{starts[1], "invalid YAML"};
    return YamlTextProblem{starts[1], "expected one YAML document, found more"};
  }
  return std::nullopt;
}

}  // namespace strata::config
