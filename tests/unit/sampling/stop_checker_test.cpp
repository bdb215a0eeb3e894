#include "strata/sampling/stop_checker.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::sampling {
namespace {

SamplingParams params_with(std::vector<std::string> stop, bool include_stop) {
  SamplingParams params;
  params.stop = std::move(stop);
  params.include_stop_str_in_output = include_stop;
  return params;
}

// Independent reference: scan end offsets of the whole text in order; at the first offset where
// some stop string ends, the longest one (then the lowest index) wins.
struct Expected {
  std::string output;
  std::optional<size_t> matched_stop;
  size_t match_end = std::string::npos;  // offset in the full text where the match completes
};

Expected reference(std::string_view text, const std::vector<std::string>& stops, bool include) {
  for (size_t end = 1; end <= text.size(); ++end) {
    std::optional<size_t> best;
    for (size_t i = 0; i < stops.size(); ++i) {
      if (!text.substr(0, end).ends_with(stops[i])) continue;
      if (!best || stops[i].size() > stops[*best].size()) best = i;
    }
    if (best) {
      const size_t start = end - stops[*best].size();
      return {std::string(text.substr(0, include ? end : start)), best, end};
    }
  }
  return {std::string(text), std::nullopt, std::string::npos};
}

// Length of the longest suffix of `text` that is a proper prefix of a stop string.
size_t reference_held(std::string_view text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const std::string& stop : stops) {
    for (size_t n = 1; n < stop.size() && n <= text.size(); ++n) {
      if (text.ends_with(std::string_view(stop).substr(0, n))) held = std::max(held, n);
    }
  }
  return held;
}

bool is_utf8_boundary(std::string_view text, size_t offset) {
  return offset >= text.size() || (static_cast<unsigned char>(text[offset]) & 0xC0) != 0x80;
}

// Feeds `pieces` and checks every streaming guarantee against the reference.
void check_stream(const std::vector<std::string_view>& pieces,
                  const std::vector<std::string>& stops, bool include, bool utf8_pieces) {
  std::string text;
  for (std::string_view piece : pieces) text += piece;
  const Expected expected = reference(text, stops, include);

  StopChecker checker(params_with(stops, include));
  std::string shown;
  size_t received = 0;
  for (std::string_view piece : pieces) {
    const StopCheckResult result = checker.append(piece);
    received += piece.size();
    shown += result.text;
    // Never shows anything that is not part of the final output (no partial stop string).
    ASSERT_TRUE(std::string_view(expected.output).starts_with(shown))
        << "shown '" << shown << "' vs final '" << expected.output << "'";
    if (utf8_pieces && !result.text.empty()) {
      EXPECT_TRUE(is_utf8_boundary(text, shown.size() - result.text.size()));
      EXPECT_TRUE(is_utf8_boundary(text, shown.size()));
    }
    // Stops exactly when the first occurrence is complete.
    const bool should_stop =
        expected.match_end != std::string::npos && received >= expected.match_end;
    ASSERT_EQ(result.stopped(), should_stop) << "after " << received << " bytes";
    ASSERT_EQ(checker.stopped(), should_stop);
    if (should_stop) {
      EXPECT_EQ(result.matched_stop, expected.matched_stop);
    } else {
      // Holds back no more than the longest suffix that could start a stop string.
      const std::string_view so_far = std::string_view(text).substr(0, received);
      EXPECT_EQ(shown.size(), received - reference_held(so_far, stops))
          << "after " << received << " bytes";
    }
  }
  shown += checker.flush();
  EXPECT_EQ(shown, expected.output);
}

struct Case {
  std::string text;
  std::vector<std::string> stops;
  std::string output_without_stop;  // hand-computed final output, stop string excluded
  std::optional<size_t> matched_stop;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {"hello world STOP and more", {"STOP"}, "hello world ", 0},
      {"STOPabc", {"STOP"}, "", 0},
      {"abcSTOP", {"STOP"}, "abc", 0},
      {"no stop in this text", {"zz", "textx"}, "no stop in this text", std::nullopt},
      {"abab", {"aba"}, "", 0},
      {"xxabab", {"aba"}, "xx", 0},
      {"ababac!", {"abac"}, "ab", 0},
      {"aaab", {"aab"}, "a", 0},
      {"<|im<|im_end|> tail", {"<|im_end|>"}, "<|im", 0},
      {"a stop here", {"stop", "top"}, "a ", 0},
      {"a stop here", {"top", "stop"}, "a ", 1},
      {"abcd", {"abcd", "bc"}, "a", 1},   // "bc" is complete first
      {"xbcdab", {"ab", "bcd"}, "x", 1},  // earliest end, not first in the list
      {"one\n\ntwo", {"\n\n", "two"}, "one", 0},
      {"Grüße, 世界。次の文", {"。"}, "Grüße, 世界", 0},
      {"Grüße, 世界。次の文", {"界。次", "ß"}, "Grü", 1},
      {"a🙂b🙂🙂x", {"🙂🙂x", "🙂c"}, "a🙂b", 0},
      {"日本語のテキスト", {"本当", "テキト"}, "日本語のテキスト", std::nullopt},
  };
  return kCases;
}

TEST(StopCheckerTest, ReferenceMatchesHandComputedOutputs) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.text);
    const Expected expected = reference(c.text, c.stops, /*include=*/false);
    EXPECT_EQ(expected.output, c.output_without_stop);
    EXPECT_EQ(expected.matched_stop, c.matched_stop);
    if (c.matched_stop) {
      EXPECT_EQ(reference(c.text, c.stops, /*include=*/true).output,
                c.output_without_stop + c.stops[*c.matched_stop]);
    }
  }
}

TEST(StopCheckerTest, EveryThreeWaySplitGivesTheSameOutput) {
  for (const bool include : {false, true}) {
    for (const Case& c : cases()) {
      const std::string_view text = c.text;
      for (size_t i = 0; i <= text.size(); ++i) {
        for (size_t j = i; j <= text.size(); ++j) {
          SCOPED_TRACE(testing::Message() << "'" << c.text << "' split at " << i << ", " << j
                                          << (include ? " (include stop)" : ""));
          const bool utf8_pieces = is_utf8_boundary(text, i) && is_utf8_boundary(text, j);
          check_stream({text.substr(0, i), text.substr(i, j - i), text.substr(j)}, c.stops, include,
                       utf8_pieces);
        }
      }
    }
  }
}

TEST(StopCheckerTest, ByteByByteAndWholeTextGiveTheSameOutput) {
  for (const bool include : {false, true}) {
    for (const Case& c : cases()) {
      SCOPED_TRACE(c.text);
      std::vector<std::string_view> bytes;
      for (size_t i = 0; i < c.text.size(); ++i)
        bytes.push_back(std::string_view(c.text).substr(i, 1));
      check_stream(bytes, c.stops, include, /*utf8_pieces=*/false);
      check_stream({c.text}, c.stops, include, /*utf8_pieces=*/true);
    }
  }
}

TEST(StopCheckerTest, HoldsBackPossibleStartThenReleasesIt) {
  StopChecker checker(params_with({"</end>"}, /*include_stop=*/false));
  StopCheckResult r = checker.append("x </e");
  EXPECT_EQ(r.text, "x ");
  EXPECT_FALSE(r.stopped());
  r = checker.append("nd");  // "</end" is still a prefix
  EXPECT_EQ(r.text, "");
  r = checker.append("s");  // "</ends" is not: all of it is released
  EXPECT_EQ(r.text, "</ends");
  r = checker.append(" <");
  EXPECT_EQ(r.text, " ");
  EXPECT_EQ(checker.flush(), "<");
}

TEST(StopCheckerTest, IncludeStopStringKeepsItAndDropsTheRest) {
  StopChecker checker(params_with({"END"}, /*include_stop=*/true));
  EXPECT_EQ(checker.append("abc E").text, "abc ");
  const StopCheckResult r = checker.append("ND after");
  EXPECT_EQ(r.text, "END");
  EXPECT_EQ(r.matched_stop, 0u);
}

TEST(StopCheckerTest, AppendAfterStopReturnsNothing) {
  StopChecker checker(params_with({"x", "yy"}, /*include_stop=*/false));
  StopCheckResult r = checker.append("ayyb");
  EXPECT_EQ(r.text, "a");
  EXPECT_EQ(r.matched_stop, 1u);
  r = checker.append("more x");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.matched_stop, 1u);
  EXPECT_EQ(checker.flush(), "");
}

TEST(StopCheckerTest, WithoutStopStringsEverythingPassesThrough) {
  StopChecker checker(SamplingParams{});
  EXPECT_EQ(checker.append("abc").text, "abc");
  EXPECT_EQ(checker.append("").text, "");
  EXPECT_EQ(checker.append("日本").text, "日本");
  EXPECT_FALSE(checker.stopped());
  EXPECT_EQ(checker.flush(), "");
}

TEST(StopCheckerDeathTest, EmptyStopStringIsABrokenInvariant) {
  EXPECT_DEATH(StopChecker(params_with({"a", ""}, false)), "empty stop string");
}

}  // namespace
}  // namespace strata::sampling
