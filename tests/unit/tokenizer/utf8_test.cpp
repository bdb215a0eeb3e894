#include "utf8.h"

#include <gtest/gtest.h>

namespace strata::tokenizer::detail {
namespace {

const std::string kFffd(kReplacementChar);

std::string lossy(std::string_view bytes) { return to_valid_utf8(bytes); }

// Expected values are Python's bytes.decode("utf-8", errors="replace"), which HF's decode matches.
TEST(Utf8Test, LossyDecodeReplacesMaximalSubparts) {
  EXPECT_EQ(lossy("plain ascii"), "plain ascii");
  EXPECT_EQ(lossy("\xE2\x82\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(lossy("\xF0\x9F\x98"), kFffd);  // truncated 4-byte sequence: one replacement
  EXPECT_EQ(lossy("a\xF0\x9F\x98"
                  "b"),
            "a" + kFffd + "b");
  EXPECT_EQ(lossy("\xE0\x80\x80"), kFffd + kFffd + kFffd);              // overlong
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // surrogate
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(lossy("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(lossy("\xFF\xFE"), kFffd + kFffd);
  EXPECT_EQ(lossy("\xF0\x9F\x98\x80\x80"), "\xF0\x9F\x98\x80" + kFffd);
  EXPECT_EQ(lossy("\xE2(\xA1"), kFffd + "(" + kFffd);
  EXPECT_EQ(lossy("\xF1\x80\x80"), kFffd);
}

TEST(Utf8Test, NonFinalDecodeHoldsBackOnlyIncompleteSequences) {
  std::string out;
  EXPECT_EQ(append_utf8_lossy("ab\xF0\x9F\x98", /*final=*/false, &out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  // Invalid as soon as the second byte is seen: replaced at once, nothing held back.
  EXPECT_EQ(append_utf8_lossy("\xE0\x80", /*final=*/false, &out), 2u);
  EXPECT_EQ(out, kFffd + kFffd);
  out.clear();
  EXPECT_EQ(append_utf8_lossy("\xE2", /*final=*/false, &out), 0u);
  EXPECT_EQ(out, "");
  EXPECT_EQ(append_utf8_lossy("\xE2", /*final=*/true, &out), 1u);
  EXPECT_EQ(out, kFffd);
}

TEST(Utf8Test, Validity) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC3"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
  EXPECT_FALSE(is_valid_utf8(std::string_view("\x80", 1)));
}

TEST(Utf8Test, WhitespaceSets) {
  for (char32_t cp : {0x09, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x3000}) {
    EXPECT_TRUE(is_unicode_whitespace(cp)) << std::hex << static_cast<uint32_t>(cp);
    EXPECT_TRUE(is_python_whitespace(cp)) << std::hex << static_cast<uint32_t>(cp);
  }
  for (char32_t cp : {0x1C, 0x1F}) {
    EXPECT_FALSE(is_unicode_whitespace(cp));
    EXPECT_TRUE(is_python_whitespace(cp));
  }
  for (char32_t cp : {0x180E, 0x200B, 0xFEFF, 0x41}) {
    EXPECT_FALSE(is_unicode_whitespace(cp)) << std::hex << static_cast<uint32_t>(cp);
    EXPECT_FALSE(is_python_whitespace(cp)) << std::hex << static_cast<uint32_t>(cp);
  }
}

TEST(Utf8Test, CodePointRoundTrip) {
  for (char32_t cp : {0x24, 0xA2, 0x20AC, 0x10348, 0x10FFFF}) {
    std::string text;
    append_utf8(cp, &text);
    size_t len = 0;
    EXPECT_EQ(decode_code_point(text, 0, &len), cp);
    EXPECT_EQ(len, text.size());
  }
}

}  // namespace
}  // namespace strata::tokenizer::detail
