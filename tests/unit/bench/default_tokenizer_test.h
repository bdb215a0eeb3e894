// Base fixture of the bench unit tests: the default model's tokenizer (STRATA_TEST_MODEL), a real
// vocabulary, loaded once per test suite.
#pragma once

#include <gtest/gtest.h>

#include "strata/model/gguf_file.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::bench {

class DefaultTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = model::GgufFile::open(STRATA_TEST_MODEL);
    ASSERT_TRUE(gguf.ok()) << gguf.status().to_string();
    auto tok = tokenizer::Tokenizer::from_gguf(**gguf);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = std::move(tok).value().release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  static inline tokenizer::Tokenizer* tokenizer_ = nullptr;
};

}  // namespace strata::bench
