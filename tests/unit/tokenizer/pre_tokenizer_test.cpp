#include "pre_tokenizer.h"

#include <gtest/gtest.h>

#include "tokenizer_spec.h"

namespace strata::tokenizer::detail {
namespace {

std::vector<std::string> split(const std::vector<std::string>& patterns, std::string_view text) {
  auto pre = PreTokenizer::create(patterns);
  EXPECT_TRUE(pre.ok()) << pre.status().to_string();
  std::vector<std::string_view> pieces;
  (*pre)->split(text, &pieces);
  return {pieces.begin(), pieces.end()};
}

using Pieces = std::vector<std::string>;

TEST(PreTokenizerTest, WhitespaceClassesAreRewritten) {
  auto rewritten = rewrite_whitespace_classes("\\s+(?!\\S)|[^\\s\\p{L}]");
  ASSERT_TRUE(rewritten.ok());
  EXPECT_EQ(rewritten->find("\\s"), std::string::npos);
  EXPECT_EQ(rewritten->find("\\S"), std::string::npos);
  // An escaped backslash followed by 's' is a literal, not \s.
  EXPECT_EQ(*rewrite_whitespace_classes("a\\\\s"), "a\\\\s");
  // ']' right after '[' or '[^' is a literal inside the class.
  EXPECT_EQ(split({"[]\\s]+"}, "a] b"), (Pieces{"a", "] ", "b"}));
  auto negated = rewrite_whitespace_classes("[^\\S]");
  EXPECT_EQ(negated.status().code(), StatusCode::kUnimplemented);
}

// HF tokenizers (Oniguruma) counts U+0085 as \s but not U+180E; PCRE2 alone would differ.
TEST(PreTokenizerTest, WhitespaceAgreesWithOniguruma) {
  EXPECT_EQ(split({kGpt2Pattern}, "hi  \xC2\x85"), (Pieces{"hi", "  \xC2\x85"}));
  EXPECT_EQ(split({kGpt2Pattern}, "hi  \xE1\xA0\x8E"), (Pieces{"hi", " ", " \xE1\xA0\x8E"}));
  EXPECT_EQ(split({kGpt2Pattern}, "hi  \xE2\x80\x8B"), (Pieces{"hi", " ", " \xE2\x80\x8B"}));
}

TEST(PreTokenizerTest, IsolatedSplitKeepsMatchesAndGaps) {
  EXPECT_EQ(split({"\\p{N}"}, "a12b"), (Pieces{"a", "1", "2", "b"}));
  EXPECT_EQ(split({}, "no patterns"), (Pieces{"no patterns"}));
  EXPECT_EQ(split({"x*"}, "abc"), (Pieces{"abc"}));  // only empty matches
  EXPECT_EQ(split({"x*"}, "axxb"), (Pieces{"a", "xx", "b"}));
  EXPECT_EQ(split({"\\p{N}", kGpt2Pattern}, "I'm 42!"), (Pieces{"I", "'m", " ", "4", "2", "!"}));
  EXPECT_TRUE(split({kGpt2Pattern}, "").empty());
}

TEST(PreTokenizerTest, LiteralEscaping) {
  EXPECT_EQ(split({escape_regex_literal("a.b")}, "xa.byaxb"), (Pieces{"x", "a.b", "yaxb"}));
}

TEST(PreTokenizerTest, BadPatternIsInvalidArgument) {
  auto pre = PreTokenizer::create({"(unclosed"});
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pre.status().message().find("(unclosed"), std::string::npos);
}

// Long runs must not hit PCRE2's JIT stack or match limits (split aborts if they do).
TEST(PreTokenizerTest, LongRunsSplit) {
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(split({kGpt2Pattern}, spaces + "a"), (Pieces{spaces.substr(1), " a"}));
  const std::string letters(1 << 20, 'q');
  EXPECT_EQ(split({kGpt2Pattern}, letters).size(), 1u);
  std::string mixed;
  for (int i = 0; i < 100000; ++i) mixed += " \n\t";
  const std::string llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  size_t total = 0;
  for (const std::string& piece : split({llama3}, mixed + "x")) total += piece.size();
  EXPECT_EQ(total, mixed.size() + 1);
}

}  // namespace
}  // namespace strata::tokenizer::detail
