#include "strata/sampling/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace strata::sampling {
namespace {

constexpr int64_t kVocab = 32000;
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(SamplingParamsTest, DefaultsAreValidAndOff) {
  const SamplingParams params;
  EXPECT_TRUE(params.validate(kVocab).ok());
  EXPECT_EQ(params.top_k, 0);
  EXPECT_EQ(params.top_p, 1.0);
  EXPECT_EQ(params.min_p, 0.0);
  EXPECT_EQ(params.repetition_penalty, 1.0);
  EXPECT_EQ(params.presence_penalty, 0.0);
  EXPECT_EQ(params.frequency_penalty, 0.0);
  EXPECT_FALSE(params.seed.has_value());
  EXPECT_EQ(params.num_logprobs, 0);
  EXPECT_FALSE(params.include_stop_str_in_output);
  EXPECT_FALSE(params.ignore_eos);
}

struct Case {
  const char* name;
  std::function<void(SamplingParams&)> edit;
  // Empty: valid. Otherwise the exact INVALID_ARGUMENT message.
  std::string error;
};

TEST(SamplingParamsTest, ValidateAcceptsBoundsAndNamesTheOffendingField) {
  const Case cases[] = {
      {"greedy", [](SamplingParams& p) { p.temperature = 0; }, ""},
      {"hot", [](SamplingParams& p) { p.temperature = 5; }, ""},
      {"negative temperature", [](SamplingParams& p) { p.temperature = -1; },
       "temperature must be >= 0, got -1"},
      {"nan temperature", [](SamplingParams& p) { p.temperature = kNan; },
       "temperature must be finite, got nan"},
      {"inf temperature", [](SamplingParams& p) { p.temperature = kInf; },
       "temperature must be finite, got inf"},
      {"top_k large", [](SamplingParams& p) { p.top_k = 1000000; }, ""},
      {"top_k negative", [](SamplingParams& p) { p.top_k = -1; },
       "top_k must be >= 0 (0 = off), got -1"},
      {"top_p tiny", [](SamplingParams& p) { p.top_p = 1e-9; }, ""},
      {"top_p zero", [](SamplingParams& p) { p.top_p = 0; }, "top_p must be in (0, 1], got 0"},
      {"top_p above one", [](SamplingParams& p) { p.top_p = 1.5; },
       "top_p must be in (0, 1], got 1.5"},
      {"top_p nan", [](SamplingParams& p) { p.top_p = kNan; }, "top_p must be finite, got nan"},
      {"min_p one", [](SamplingParams& p) { p.min_p = 1; }, ""},
      {"min_p negative", [](SamplingParams& p) { p.min_p = -0.1; },
       "min_p must be in [0, 1], got -0.1"},
      {"min_p above one", [](SamplingParams& p) { p.min_p = 1.01; },
       "min_p must be in [0, 1], got 1.01"},
      {"repetition small", [](SamplingParams& p) { p.repetition_penalty = 0.5; }, ""},
      {"repetition zero", [](SamplingParams& p) { p.repetition_penalty = 0; },
       "repetition_penalty must be > 0 (1 = off), got 0"},
      {"repetition negative", [](SamplingParams& p) { p.repetition_penalty = -1.2; },
       "repetition_penalty must be > 0 (1 = off), got -1.2"},
      {"presence bounds", [](SamplingParams& p) { p.presence_penalty = -2; }, ""},
      {"presence too big", [](SamplingParams& p) { p.presence_penalty = 2.5; },
       "presence_penalty must be in [-2, 2], got 2.5"},
      {"presence inf", [](SamplingParams& p) { p.presence_penalty = -kInf; },
       "presence_penalty must be finite, got -inf"},
      {"frequency bounds", [](SamplingParams& p) { p.frequency_penalty = 2; }, ""},
      {"frequency too small", [](SamplingParams& p) { p.frequency_penalty = -3; },
       "frequency_penalty must be in [-2, 2], got -3"},
      {"max_tokens one", [](SamplingParams& p) { p.max_tokens = 1; }, ""},
      {"max_tokens zero", [](SamplingParams& p) { p.max_tokens = 0; },
       "max_tokens must be >= 1, got 0"},
      {"num_logprobs max", [](SamplingParams& p) { p.num_logprobs = 20; }, ""},
      {"num_logprobs too many", [](SamplingParams& p) { p.num_logprobs = 21; },
       "num_logprobs must be in [0, 20], got 21"},
      {"num_logprobs negative", [](SamplingParams& p) { p.num_logprobs = -1; },
       "num_logprobs must be in [0, 20], got -1"},
      {"stop ids in vocab",
       [](SamplingParams& p) {
         p.stop_token_ids = {0, kVocab - 1};
       },
       ""},
      {"stop id past vocab",
       [](SamplingParams& p) {
         p.stop_token_ids = {2, kVocab};
       },
       "stop_token_ids[1] must be in [0, 32000), got 32000"},
      {"stop id negative", [](SamplingParams& p) { p.stop_token_ids = {-1}; },
       "stop_token_ids[0] must be in [0, 32000), got -1"},
      {"sixteen stop strings", [](SamplingParams& p) { p.stop.assign(16, "x"); }, ""},
      {"seventeen stop strings", [](SamplingParams& p) { p.stop.assign(17, "x"); },
       "stop must be at most 16 strings, got 17 strings"},
      {"empty stop string",
       [](SamplingParams& p) {
         p.stop = {"a", "b", ""};
       },
       "stop[2] must be non-empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams params;
    c.edit(params);
    const Status status = params.validate(kVocab);
    if (c.error.empty()) {
      EXPECT_TRUE(status.ok()) << status.to_string();
    } else {
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(status.message(), c.error);
    }
  }
}

TEST(SamplingParamsTest, ValidateRejectsNonPositiveVocabSize) {
  const Status status = SamplingParams{}.validate(0);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "vocab_size must be > 0, got 0");
}

}  // namespace
}  // namespace strata::sampling
