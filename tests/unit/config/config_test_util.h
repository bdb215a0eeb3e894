// Helpers shared by the config tests: the shipped files, and YAML cases that must load or fail
// with a message.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/config/config_loader.h"
#include "strata/config/deployment_config.h"

namespace strata::config::test_util {

inline std::string config_path(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/configs/" + name;
}

inline std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

inline DeploymentConfig with_path(std::string path) {
  DeploymentConfig config;
  config.model.path = std::move(path);
  return config;
}

// ---- validation -------------------------------------------------------------------------------

struct ErrorCase {
  const char* name;
  std::string yaml;  // after a valid `model:` section unless it has its own
  StatusCode code;   // kOk: valid
  std::string message_part;
};

inline void expect_cases(const std::vector<ErrorCase>& cases) {
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string model = c.yaml.starts_with("model:") ? "" : "model:\n  path: m.gguf\n";
    StatusOr<DeploymentConfig> loaded = parse_config(model + c.yaml, "t.yaml");
    EXPECT_EQ(loaded.status().code(), c.code) << loaded.status().to_string();
    if (!c.message_part.empty()) {
      EXPECT_NE(loaded.status().message().find(c.message_part), std::string::npos)
          << "message: " << loaded.status().message() << "\nwant: " << c.message_part;
    }
  }
}

constexpr StatusCode kOk = StatusCode::kOk;
constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

}  // namespace strata::config::test_util
