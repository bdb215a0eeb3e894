// Test helper: the chat-template cases tests/reference/chat_template_reference.py writes.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace strata::test_util {

// The parsed cases.json (insertion-ordered, as the templates see their data); read once.
inline const nlohmann::ordered_json& chat_template_cases() {
  static const nlohmann::ordered_json root = [] {
    const std::string path = std::string(STRATA_TEST_DATA_DIR) + "/chat_templates/cases.json";
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << "missing " << path;
    std::ostringstream contents;
    contents << in.rdbuf();
    return nlohmann::ordered_json::parse(contents.str());
  }();
  return root;
}

}  // namespace strata::test_util
