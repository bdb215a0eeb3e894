// Checks on a deployment file's text that yaml-cpp 0.7 does not make, run before it parses: the
// text is UTF-8 (yaml-cpp passes invalid bytes through and writes them back as U+FFFD) of YAML's
// printable characters (yaml-cpp reads raw control characters, then writes them escaped), and the
// stream holds at most one document, counted without YAML::LoadAll, which never returns on some
// invalid input (a lone ',': jbeder/yaml-cpp#1040, fixed in 0.8.x). Both found by fuzzing.
#pragma once

#include <yaml-cpp/mark.h>

#include <optional>
#include <string>
#include <string_view>

namespace strata::config {

struct YamlTextProblem {
  YAML::Mark mark;  // where it is (0-based line and column)
  std::string message;
};

// nullopt for printable UTF-8 text of at most one document. May throw YAML::Exception for text the
// parser rejects.
std::optional<YamlTextProblem> check_yaml_text(std::string_view text);

}  // namespace strata::config
