#include "strata/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace strata::sampling {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

SamplingParams seeded(uint64_t seed) {
  SamplingParams params;
  params.seed = seed;
  return params;
}

SamplingParams greedy_params() {
  SamplingParams params;
  params.temperature = 0;
  return params;
}

std::vector<double> softmax(const std::vector<double>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += probs[i] = std::exp(logits[i] - max);
  for (double& p : probs) p /= sum;
  return probs;
}

std::vector<double> log_softmax(const std::vector<double>& logits) {
  std::vector<double> out = softmax(logits);
  for (double& p : out) p = std::log(p);
  return out;
}

std::vector<float> to_float(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

// Logits whose softmax is exactly `probs` (up to float rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Samples `num_draws` tokens from the same logits, accepting each, and counts them per id.
std::vector<int64_t> draw_counts(SequenceSampler& sampler, std::span<const float> logits,
                                 int num_draws) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int i = 0; i < num_draws; ++i) {
    const TokenId token = sampler.sample(logits).token;
    ++counts[static_cast<size_t>(token)];
    sampler.accept(token);
  }
  return counts;
}

std::set<TokenId> support_of(const std::vector<int64_t>& counts) {
  std::set<TokenId> support;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) support.insert(static_cast<TokenId>(i));
  }
  return support;
}

std::set<TokenId> draw_support(const SamplingParams& params, std::span<const float> logits,
                               int num_draws) {
  SequenceSampler sampler(params, static_cast<int64_t>(logits.size()), {});
  return support_of(draw_counts(sampler, logits, num_draws));
}

std::vector<TokenId> random_logits_tokens(SequenceSampler& sampler, int num_steps,
                                          uint64_t logits_seed) {
  std::mt19937_64 gen(logits_seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(static_cast<size_t>(sampler.vocab_size()));
  std::vector<TokenId> tokens;
  for (int step = 0; step < num_steps; ++step) {
    for (float& x : logits) x = normal(gen);
    tokens.push_back(sampler.sample(logits).token);
    sampler.accept(tokens.back());
  }
  return tokens;
}

// ---- greedy ------------------------------------------------------------------------------------

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  struct Case {
    std::vector<float> logits;
    TokenId expected;
  };
  const Case cases[] = {
      {{0.1f, 2.0f, -1.0f, 1.9f}, 1},   {{-5.0f, -3.0f, -4.0f}, 1},
      {{1.0f, 3.0f, 3.0f, 2.0f}, 1},    {{7.0f, 7.0f, 7.0f}, 0},
      {{kNegInf, -100.0f, kNegInf}, 1}, {{0.0f}, 0},
      {{1.0f, 2.0f, 2.5f, 2.5f}, 2},
  };
  for (const Case& c : cases) {
    SequenceSampler sampler(greedy_params(), static_cast<int64_t>(c.logits.size()), {});
    EXPECT_EQ(sampler.sample(c.logits).token, c.expected);
  }
}

TEST(SamplerTest, TemperatureBelowEpsilonIsGreedy) {
  SamplingParams params = seeded(3);
  params.temperature = kGreedyTemperature / 2;
  SequenceSampler sampler(params, 4, {});
  const std::vector<float> logits = {1.0f, 1.0f - 1e-6f, 0.5f, 1.0f};
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sampler.sample(logits).token, 0);
    sampler.accept(0);
  }
}

// ---- temperature -------------------------------------------------------------------------------

TEST(SamplerTest, TemperatureSamplingFollowsTheSoftmax) {
  const std::vector<double> logits = {2.0, 1.0, 0.5, 0.0, -1.0, -2.0};
  constexpr int kDraws = 20000;
  // 99.99th percentile of chi-square with 5 degrees of freedom is 25.7. The wrong temperature
  // (e.g. 1 instead of 0.5) gives a statistic in the hundreds.
  constexpr double kChiSquareLimit = 25.7;
  for (const double temperature : {0.5, 1.0, 2.0}) {
    SCOPED_TRACE(temperature);
    SamplingParams params = seeded(1234);
    params.temperature = temperature;
    SequenceSampler sampler(params, static_cast<int64_t>(logits.size()), {});
    const std::vector<int64_t> counts = draw_counts(sampler, to_float(logits), kDraws);
    std::vector<double> scaled = logits;
    for (double& x : scaled) x /= temperature;
    const std::vector<double> probs = softmax(scaled);
    double chi_square = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
      const double expected = probs[i] * kDraws;
      chi_square += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    EXPECT_LT(chi_square, kChiSquareLimit);
  }
}

TEST(SamplerTest, MaskedTokensAreNeverDrawn) {
  SamplingParams params = seeded(9);
  params.temperature = 100;  // nearly uniform over the unmasked tokens
  const std::vector<float> logits = {kNegInf, 0.0f, kNegInf, 5.0f, kNegInf};
  EXPECT_EQ(draw_support(params, logits, 2000), (std::set<TokenId>{1, 3}));
}

// ---- truncation ------------------------------------------------------------------------------

struct SupportCase {
  const char* name;
  std::vector<double> probs;  // softmax of the logits handed to the sampler
  int32_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  std::set<TokenId> expected;
};

TEST(SamplerTest, TruncationReturnsExactlyTheAllowedSupport) {
  const std::vector<double> p4 = {0.4, 0.3, 0.2, 0.1};
  // Nearly equal probabilities, decreasing with the id: the cut falls among tokens whose logits
  // differ by less than the selection's histogram resolution.
  const auto nearly_flat = [](int n) {
    std::vector<double> probs;
    for (int i = 0; i < n; ++i) probs.push_back(std::exp(-0.0001 * i));
    return probs;
  };
  const auto first_n = [](int n) {
    std::set<TokenId> ids;
    for (int i = 0; i < n; ++i) ids.insert(i);
    return ids;
  };
  const std::vector<double> shuffled = {0.1, 0.3, 0.05, 0.4, 0.15};
  const SupportCase cases[] = {
      {"no truncation", p4, 0, 1.0, 0.0, {0, 1, 2, 3}},
      {"top_k 1", p4, 1, 1.0, 0.0, {0}},
      {"top_k 3", p4, 3, 1.0, 0.0, {0, 1, 2}},
      {"top_k >= vocab", p4, 10, 1.0, 0.0, {0, 1, 2, 3}},
      {"top_k unsorted ids", shuffled, 2, 1.0, 0.0, {1, 3}},
      {"top_k tie keeps lowest id", {0.3, 0.3, 0.3, 0.1}, 2, 1.0, 0.0, {0, 1}},
      {"top_k 70 of nearly flat", nearly_flat(100), 70, 1.0, 0.0, first_n(70)},
      {"top_p small keeps argmax", p4, 0, 0.3, 0.0, {0}},
      {"top_p 0.45 of nearly flat", nearly_flat(8), 0, 0.45, 0.0, first_n(4)},
      {"top_p 0.65", p4, 0, 0.65, 0.0, {0, 1}},
      {"top_p 0.75", p4, 0, 0.75, 0.0, {0, 1, 2}},
      {"top_p 0.95", p4, 0, 0.95, 0.0, {0, 1, 2, 3}},
      {"top_p unsorted ids", shuffled, 0, 0.8, 0.0, {1, 3, 4}},
      {"min_p 0.6", {0.5, 0.25, 0.15, 0.1}, 0, 1.0, 0.6, {0}},
      {"min_p 0.25", {0.5, 0.25, 0.15, 0.1}, 0, 1.0, 0.25, {0, 1, 2}},
      {"min_p 0.19", {0.5, 0.25, 0.15, 0.1}, 0, 1.0, 0.19, {0, 1, 2, 3}},
      {"min_p unsorted ids", shuffled, 0, 1.0, 0.3, {1, 3, 4}},
      // top-p runs on the top-k set renormalised: 0.4/0.7 = 0.57 >= 0.55 (0.4 alone is not).
      {"top_k then top_p", p4, 2, 0.55, 0.0, {0}},
      // top-p before min-p: top-p keeps {0, 1}; min-p (0.5 * 0.5) keeps both. Min-p first would
      // renormalise {0, 1} to {0.625, 0.375} and top-p 0.6 would keep only 0.
      {"top_p then min_p", {0.5, 0.3, 0.2}, 0, 0.6, 0.5, {0, 1}},
      // Each stage removes one token: top-k 5 drops id 5 (tie with id 2), top-p 0.9 then drops
      // id 2 (0.9 of the renormalised mass is reached at id 0), min-p (0.3 * 0.35) drops id 0.
      {"top_k, top_p, min_p", {0.1, 0.3, 0.05, 0.35, 0.15, 0.05}, 5, 0.9, 0.3, {1, 3, 4}},
  };
  for (const SupportCase& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams params = seeded(77);
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    EXPECT_EQ(draw_support(params, logits_of(c.probs), 3000), c.expected);
  }
}

// Large-vocabulary logits: `num_hot` tokens at random positions with logits in [0, 0.5] (all
// distinct), every other token in [-12, -9]. Exercises the histogram-bucket selection of top-k
// and top-p, with cuts at a bucket edge (top-p 0.3) and inside a bucket (top-p 0.5).
std::vector<float> large_vocab_logits(int64_t vocab, int num_hot, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> cold(-12.0f, -9.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) x = cold(gen);
  std::vector<size_t> positions(static_cast<size_t>(vocab));
  std::iota(positions.begin(), positions.end(), 0);
  std::shuffle(positions.begin(), positions.end(), gen);
  for (int i = 0; i < num_hot; ++i) logits[positions[static_cast<size_t>(i)]] = 0.5f * i / num_hot;
  return logits;
}

// Reference truncation by a full sort, in double precision.
std::set<TokenId> reference_support(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<TokenId> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
  const double max = logits[order[0]];
  double total = 0;
  for (TokenId id : order) total += std::exp(logits[id] - max);
  if (p.top_p < 1) {
    double mass = 0;
    for (size_t j = 0; j < order.size(); ++j) {
      mass += std::exp(logits[order[j]] - max) / total;
      if (mass >= p.top_p) {
        order.resize(j + 1);
        break;
      }
    }
  }
  std::set<TokenId> support;
  for (TokenId id : order) {
    if (std::exp(logits[id] - max) >= p.min_p) support.insert(id);
  }
  return support;
}

TEST(SamplerTest, LargeVocabTruncationMatchesAFullSort) {
  constexpr int64_t kVocab = 151936;
  const std::vector<float> logits = large_vocab_logits(kVocab, 200, 5);
  struct Case {
    const char* name;
    int32_t top_k;
    double top_p;
    double min_p;
    size_t min_support;  // guards against a degenerate case that tests nothing
  };
  const Case cases[] = {
      {"top_k 40 (insertion)", 40, 1.0, 0.0, 40},
      {"top_k 100 (nth_element)", 100, 1.0, 0.0, 100},
      {"top_p 0.3 (nucleus)", 0, 0.3, 0.0, 40},
      {"top_p 0.5 (nucleus)", 0, 0.5, 0.0, 60},
      {"min_p 0.8", 0, 1.0, 0.8, 40},
      {"top_k 120 + top_p 0.5", 120, 0.5, 0.0, 40},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams params = seeded(11);
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    const std::set<TokenId> expected = reference_support(logits, params);
    ASSERT_GE(expected.size(), c.min_support);
    ASSERT_LE(expected.size(), 100u);  // ~1% or more each: 1500 draws see every one
    EXPECT_EQ(draw_support(params, logits, 1500), expected);
  }
}

TEST(SamplerTest, LargeVocabWithoutTruncationCanDrawColdTokens) {
  // 200 hot tokens hold ~98% of the mass; the ~152K cold ones the rest.
  constexpr int64_t kVocab = 151936;
  const std::vector<float> logits = large_vocab_logits(kVocab, 200, 5);
  SequenceSampler sampler(seeded(4), kVocab, {});
  const std::vector<int64_t> counts = draw_counts(sampler, logits, 2000);
  int64_t num_cold = 0;
  for (size_t i = 0; i < counts.size(); ++i) num_cold += logits[i] < -1 ? counts[i] : 0;
  EXPECT_GT(num_cold, 10);  // expected ~40
  EXPECT_LT(num_cold, 100);
}

// ---- penalties -------------------------------------------------------------------------------

// Processed logprobs of every token, by id (num_logprobs must be >= vocab size).
std::vector<double> all_logprobs(const SampleResult& result, size_t vocab) {
  std::vector<double> out(vocab, std::nan(""));
  for (const TokenLogprob& t : result.top_logprobs) out[static_cast<size_t>(t.token)] = t.logprob;
  return out;
}

void expect_processed_logits(const SequenceSampler& sampler, const std::vector<float>& logits,
                             const std::vector<double>& expected_logits) {
  const std::vector<double> expected = log_softmax(expected_logits);
  const std::vector<double> actual = all_logprobs(sampler.sample(logits), logits.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5) << "token " << i;
  }
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams params = greedy_params();
  params.repetition_penalty = 2.0;
  params.num_logprobs = 5;
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 1.5f, 0.0f};
  const std::vector<TokenId> prompt = {0, 1, 1};
  SequenceSampler sampler(params, 5, prompt);
  expect_processed_logits(sampler, logits, {1.0, -2.0, 0.5, 1.5, 0.0});
  EXPECT_EQ(sampler.sample(logits).token, 3);  // 0 without the penalty
  sampler.accept(3);
  // Seen once or many times: the same penalty; the output counts as well as the prompt.
  expect_processed_logits(sampler, logits, {1.0, -2.0, 0.5, 0.75, 0.0});
  EXPECT_EQ(sampler.sample(logits).token, 0);
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  SamplingParams params = greedy_params();
  params.presence_penalty = 0.5;
  params.frequency_penalty = 0.25;
  params.num_logprobs = 4;
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<TokenId> prompt = {0, 0, 1};  // not penalised
  SequenceSampler sampler(params, 4, prompt);
  expect_processed_logits(sampler, logits, {1.0, 1.0, 1.0, 1.0});
  sampler.accept(2);
  sampler.accept(2);
  sampler.accept(3);
  // 1 - 0.25 * count - 0.5 for generated tokens.
  expect_processed_logits(sampler, logits, {1.0, 1.0, 0.0, 0.25});
}

TEST(SamplerTest, NegativePresencePenaltyEncouragesRepeats) {
  SamplingParams params = greedy_params();
  params.presence_penalty = -1.0;
  SequenceSampler sampler(params, 3, {});
  const std::vector<float> logits = {1.0f, 0.5f, 0.2f};
  sampler.accept(2);
  EXPECT_EQ(sampler.sample(logits).token, 2);  // 0.2 + 1 > 1
}

TEST(SamplerTest, RepetitionPenaltyAppliesBeforePresencePenalty) {
  SamplingParams params = greedy_params();
  params.repetition_penalty = 2.0;
  params.presence_penalty = 1.0;
  params.num_logprobs = 2;
  SequenceSampler sampler(params, 2, {});
  sampler.accept(0);
  // 3 / 2 - 1 = 0.5 (the other order would give (3 - 1) / 2 = 1).
  expect_processed_logits(sampler, {3.0f, 0.0f}, {0.5, 0.0});
}

TEST(SamplerTest, PenaltiesKeepMaskedTokensMasked) {
  SamplingParams params = greedy_params();
  params.repetition_penalty = 0.5;
  params.frequency_penalty = -2.0;
  params.num_logprobs = 3;
  const std::vector<TokenId> prompt = {1};
  SequenceSampler sampler(params, 3, prompt);
  sampler.accept(1);
  const SampleResult result = sampler.sample(std::vector<float>{0.0f, kNegInf, -1.0f});
  EXPECT_EQ(result.token, 0);
  EXPECT_EQ(all_logprobs(result, 3)[1], -std::numeric_limits<double>::infinity());
}

// ---- seeds and determinism ---------------------------------------------------------------------

TEST(SamplerTest, SameSeedGivesSameTokensAndDifferentSeedsDiffer) {
  constexpr int64_t kVocab = 1000;
  SequenceSampler a(seeded(42), kVocab, {});
  SequenceSampler b(seeded(42), kVocab, {});
  SequenceSampler c(seeded(43), kVocab, {});
  const std::vector<TokenId> tokens_a = random_logits_tokens(a, 64, 1);
  EXPECT_EQ(tokens_a, random_logits_tokens(b, 64, 1));
  EXPECT_NE(tokens_a, random_logits_tokens(c, 64, 1));
}

TEST(SamplerTest, ResultDoesNotDependOnOtherSequencesOrRepeatedCalls) {
  constexpr int64_t kVocab = 500;
  SequenceSampler alone(seeded(8), kVocab, {});
  const std::vector<TokenId> expected = random_logits_tokens(alone, 32, 2);

  // The same sequence batched with another one, sampled twice per step before accept().
  SequenceSampler mine(seeded(8), kVocab, {});
  SequenceSampler other(seeded(8), kVocab, {});
  std::mt19937_64 gen(2);
  std::mt19937_64 other_gen(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(kVocab);
  std::vector<float> other_logits(kVocab);
  std::vector<TokenId> tokens;
  for (int step = 0; step < 32; ++step) {
    for (float& x : other_logits) x = normal(other_gen);
    other.accept(other.sample(other_logits).token);
    for (float& x : logits) x = normal(gen);
    const TokenId first = mine.sample(logits).token;
    EXPECT_EQ(mine.sample(logits).token, first);
    tokens.push_back(first);
    mine.accept(first);
  }
  EXPECT_EQ(tokens, expected);
}

TEST(SamplerTest, RebuiltSamplerContinuesIdentically) {
  constexpr int64_t kVocab = 300;
  SamplingParams params = seeded(5);
  params.repetition_penalty = 1.3;
  params.frequency_penalty = 0.4;
  const std::vector<TokenId> prompt = {3, 1, 4, 1, 5};
  SequenceSampler original(params, kVocab, prompt);
  const std::vector<TokenId> prefix = random_logits_tokens(original, 10, 6);
  const std::vector<TokenId> rest = random_logits_tokens(original, 10, 7);

  SequenceSampler rebuilt(params, kVocab, prompt);  // e.g. after preemption
  for (TokenId token : prefix) rebuilt.accept(token);
  EXPECT_EQ(rebuilt.num_generated(), 10);
  EXPECT_EQ(random_logits_tokens(rebuilt, 10, 7), rest);
}

TEST(SamplerTest, WithoutSeedEachSamplerDrawsItsOwn) {
  constexpr int64_t kVocab = 1000;
  SequenceSampler a(SamplingParams{}, kVocab, {});
  SequenceSampler b(SamplingParams{}, kVocab, {});
  EXPECT_NE(a.seed(), b.seed());
  // The drawn seed reproduces the run.
  SequenceSampler replay(seeded(a.seed()), kVocab, {});
  EXPECT_EQ(random_logits_tokens(a, 32, 3), random_logits_tokens(replay, 32, 3));
}

// ---- logprobs --------------------------------------------------------------------------------

TEST(SamplerTest, LogprobsMatchAHandComputation) {
  SamplingParams params = greedy_params();
  params.num_logprobs = 2;
  SequenceSampler sampler(params, 3, {});
  const SampleResult result = sampler.sample(std::vector<float>{1.0f, 2.0f, 3.0f});
  // log(e + e^2 + e^3) = 3.4076059644
  EXPECT_EQ(result.token, 2);
  EXPECT_NEAR(result.logprob, 3.0 - 3.4076059644, 1e-6);
  ASSERT_EQ(result.top_logprobs.size(), 2u);
  EXPECT_EQ(result.top_logprobs[0].token, 2);
  EXPECT_NEAR(result.top_logprobs[0].logprob, 3.0 - 3.4076059644, 1e-6);
  EXPECT_EQ(result.top_logprobs[1].token, 1);
  EXPECT_NEAR(result.top_logprobs[1].logprob, 2.0 - 3.4076059644, 1e-6);
}

TEST(SamplerTest, LogprobsCoverTheVocabularySortedWithTemperatureApplied) {
  constexpr int64_t kVocab = 20;
  std::mt19937_64 gen(12);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::vector<double> logits(kVocab);
  for (double& x : logits) x = static_cast<float>(normal(gen));
  logits[7] = logits[3];  // a tie: lower id first

  SamplingParams params = seeded(1);
  params.temperature = 0.7;
  params.top_k = 3;  // truncation does not change logprobs
  params.num_logprobs = kVocab;
  SequenceSampler sampler(params, kVocab, {});
  const SampleResult result = sampler.sample(to_float(logits));

  std::vector<double> scaled = logits;
  for (double& x : scaled) x /= 0.7;
  const std::vector<double> expected = log_softmax(scaled);
  ASSERT_EQ(result.top_logprobs.size(), static_cast<size_t>(kVocab));
  double total = 0;
  for (size_t i = 0; i < result.top_logprobs.size(); ++i) {
    const TokenLogprob& t = result.top_logprobs[i];
    total += std::exp(t.logprob);
    EXPECT_NEAR(t.logprob, expected[static_cast<size_t>(t.token)], 1e-5);
    if (i > 0) {
      const TokenLogprob& prev = result.top_logprobs[i - 1];
      EXPECT_TRUE(prev.logprob > t.logprob || (prev.logprob == t.logprob && prev.token < t.token))
          << "position " << i;
    }
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_NEAR(result.logprob, expected[static_cast<size_t>(result.token)], 1e-5);
  std::vector<TokenId> ids;
  for (const TokenLogprob& t : result.top_logprobs) ids.push_back(t.token);
  EXPECT_LT(std::find(ids.begin(), ids.end(), 3), std::find(ids.begin(), ids.end(), 7));
}

TEST(SamplerTest, SampledTokenLogprobIsTakenBeforeTruncation) {
  SamplingParams params = seeded(2);
  params.top_k = 1;
  params.num_logprobs = 0;
  SequenceSampler sampler(params, 2, {});
  const SampleResult result = sampler.sample(std::vector<float>{0.0f, 0.0f});
  EXPECT_EQ(result.token, 0);  // the only survivor of top-k 1 (tie: lowest id)
  EXPECT_NEAR(result.logprob, std::log(0.5), 1e-6);
  EXPECT_TRUE(result.top_logprobs.empty());
}

TEST(SamplerTest, FewerLogprobsThanRequestedWhenTheVocabularyIsSmaller) {
  SamplingParams params = greedy_params();
  params.num_logprobs = 20;
  SequenceSampler sampler(params, 3, {});
  EXPECT_EQ(sampler.sample(std::vector<float>{0.0f, 1.0f, 2.0f}).top_logprobs.size(), 3u);
}

// ---- broken invariants -------------------------------------------------------------------------

TEST(SamplerDeathTest, PreconditionsAreChecked) {
  SamplingParams bad;
  bad.top_p = 0;
  EXPECT_DEATH(SequenceSampler(bad, 4, {}), "top_p must be in");
  const std::vector<TokenId> prompt = {4};
  EXPECT_DEATH(SequenceSampler(SamplingParams{}, 4, prompt), "prompt token 4");
  SequenceSampler sampler(seeded(1), 4, {});
  EXPECT_DEATH(sampler.sample(std::vector<float>{1.0f, 2.0f}), "vocab_size_");
  EXPECT_DEATH(sampler.sample(std::vector<float>{1.0f, std::nanf(""), 0.0f, 0.0f}), "NaN");
  EXPECT_DEATH(sampler.sample(std::vector<float>(4, kNegInf)), "every logit is -inf");
  EXPECT_DEATH(sampler.accept(4), "outside");
}

}  // namespace
}  // namespace strata::sampling
