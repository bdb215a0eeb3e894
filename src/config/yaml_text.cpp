#include "yaml_text.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <sstream>
#include <vector>

#include "strata/common/utf8.h"

namespace strata::config {
namespace {

// Where the first byte that is not part of valid UTF-8 is, if any.
std::optional<YAML::Mark> first_invalid_utf8(std::string_view text) {
  YAML::Mark mark;
  mark.line = 0;
  mark.column = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t length = 0;
    if (classify_utf8_sequence(text.substr(pos), &length) != Utf8Sequence::kValid) return mark;
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
  if (const std::optional<YAML::Mark> bad = first_invalid_utf8(text)) {
    return YamlTextProblem{*bad, "not valid UTF-8"};
  }
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
