// LeanKV's significance policy (kv/leankv_policy.h): the prompt rule and Algorithm 1 on hand-worked
// cases, then a head simulated over a synthetic attention stream (a few heavy-hitter tokens,
// random logits) for hundreds of decode steps, checking the properties the paper's algorithm
// implies: stored tokens grow by at most one per step, neither tier shrinks, window tokens are
// never touched, tokens only move down, and pruning actually happens.

#include "strata/kv/leankv_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace strata::kv::leankv {
namespace {

TEST(LeanKvPolicy, PromptTiersUseOneOverPositionAndKeepTheWindow) {
  // alpha_high 1, alpha_low 0.2: token p is high from 1 / (p + 1), low from 0.2 / (p + 1).
  const Thresholds t{1.0, 0.2, 2};
  const std::vector<float> scores = {1.0f, 0.4f, 0.5f, 0.05f, 0.045f, 0.0f, 0.0f};
  std::vector<Tier> tiers(scores.size());
  prompt_tiers(scores, t, tiers);
  // p=0: 1 >= 1 high; p=1: 0.4 < 0.5, >= 0.1 low; p=2: 0.5 >= 1/3 high; p=3: 0.05 = 0.2/4 low;
  // p=4: 0.045 >= 0.2/5 low; the last two are the window whatever their scores.
  EXPECT_EQ(tiers, (std::vector<Tier>{Tier::kHigh, Tier::kLow, Tier::kHigh, Tier::kLow, Tier::kLow,
                                      Tier::kWindow, Tier::kWindow}));
  const std::vector<float> low_scores = {0.3f, 0.01f, 0.0f};
  std::vector<Tier> more(3);
  prompt_tiers(low_scores, Thresholds{1.0, 0.2, 1}, more);
  EXPECT_EQ(more, (std::vector<Tier>{Tier::kLow, Tier::kPruned, Tier::kWindow}));
}

TEST(LeanKvPolicy, DecodeStepFollowsAlgorithm1) {
  const Thresholds t{2.0, 0.5, 4};  // at length 10: T_h = 0.2, T_l = 0.05
  const std::vector<float> high = {0.3f, 0.1f, 0.25f, 0.1f};
  const std::vector<float> low = {0.06f, 0.01f};
  // A high candidate demotes the least significant high token (the first of equals) to low.
  DecodeAction a = decode_step(0.2f, high, low, 10, t);
  EXPECT_EQ(a.candidate, Tier::kHigh);
  EXPECT_EQ(a.victim, 1);
  EXPECT_EQ(a.victim_to, Tier::kLow);
  // ... and prunes it when it is below T_l.
  const std::vector<float> weak_high = {0.3f, 0.04f};
  a = decode_step(0.5f, weak_high, low, 10, t);
  EXPECT_EQ(a.victim, 1);
  EXPECT_EQ(a.victim_to, Tier::kPruned);
  // No high token below T_h: nothing moves.
  const std::vector<float> strong_high = {0.3f, 0.2f};
  a = decode_step(0.5f, strong_high, low, 10, t);
  EXPECT_EQ(a.candidate, Tier::kHigh);
  EXPECT_EQ(a.victim, -1);
  // A low candidate prunes the least significant low token if it is below T_l.
  a = decode_step(0.1f, high, low, 10, t);
  EXPECT_EQ(a.candidate, Tier::kLow);
  EXPECT_EQ(a.victim, 1);
  EXPECT_EQ(a.victim_to, Tier::kPruned);
  a = decode_step(0.1f, high, std::vector<float>{0.06f}, 10, t);
  EXPECT_EQ(a.victim, -1);
  // Below T_l the candidate is pruned and nothing else moves.
  a = decode_step(0.01f, high, low, 10, t);
  EXPECT_EQ(a.candidate, Tier::kPruned);
  EXPECT_EQ(a.victim, -1);
  // Thresholds scale with 1 / length: at length 40, 0.06 is high (T_h = 0.05).
  EXPECT_EQ(decode_step(0.06f, high, low, 40, t).candidate, Tier::kHigh);
  EXPECT_EQ(decode_step(0.06f, {}, low, 40, t).victim, -1);
}

// One head over a synthetic attention stream. Tokens 3, 17 and 40 are heavy hitters; every
// other logit is N(0, 1.5). Pruned tokens receive no more attention (their KV is gone).
TEST(LeanKvPolicy, SimulatedHeadKeepsTheAlgorithmsInvariants) {
  const Thresholds t{1.0, 0.3, 16};
  constexpr int kPrompt = 200, kSteps = 400;
  std::mt19937 rng(11);
  std::normal_distribution<double> noise(0.0, 1.5);
  auto logit = [&](int p) { return (p == 3 || p == 17 || p == 40 ? 7.0 : 0.0) + noise(rng); };

  std::vector<double> acc;
  std::vector<Tier> tier;
  // Attention of a query at `q` over every kept token <= q, added to the accumulators.
  auto attend = [&](int q) {
    std::vector<double> e(q + 1, 0.0);
    double sum = 0;
    for (int p = 0; p <= q; ++p) {
      if (tier[p] != Tier::kPruned) sum += e[p] = std::exp(logit(p));
    }
    for (int p = 0; p < q; ++p) acc[p] += e[p] / sum;
  };
  acc.assign(kPrompt, 0.0);
  tier.assign(kPrompt, Tier::kWindow);
  for (int q = 1; q < kPrompt; ++q) attend(q);
  std::vector<float> scores(kPrompt);
  for (int p = 0; p + 1 < kPrompt; ++p) scores[p] = static_cast<float>(acc[p] / (kPrompt - 1 - p));
  prompt_tiers(scores, t, tier);

  auto members = [&](Tier which) {
    std::vector<int> out;
    for (size_t p = 0; p < tier.size(); ++p) {
      if (tier[p] == which) out.push_back(static_cast<int>(p));
    }
    return out;
  };
  int pruned_in_decode = 0, demoted = 0;
  for (int step = 0; step < kSteps; ++step) {
    const int n = kPrompt + step + 1;  // the new token's position is n - 1
    acc.push_back(0.0);
    tier.push_back(Tier::kWindow);
    attend(n - 1);
    const std::vector<int> high = members(Tier::kHigh), low = members(Tier::kLow);
    auto score = [&](int p) { return static_cast<float>(acc[p] / (n - 1 - p)); };
    std::vector<float> high_scores, low_scores;
    for (int p : high) high_scores.push_back(score(p));
    for (int p : low) low_scores.push_back(score(p));
    const int candidate = n - 1 - t.window;
    ASSERT_EQ(tier[candidate], Tier::kWindow);
    const std::vector<Tier> before = tier;
    const DecodeAction a = decode_step(score(candidate), high_scores, low_scores, n, t);
    tier[candidate] = a.candidate;
    if (a.victim >= 0) {
      const int victim = (a.candidate == Tier::kHigh ? high : low)[a.victim];
      tier[victim] = a.victim_to;
      pruned_in_decode += a.victim_to == Tier::kPruned;
      demoted += a.victim_to == Tier::kLow;
    }
    const std::vector<int> high_after = members(Tier::kHigh), low_after = members(Tier::kLow);
    EXPECT_GE(high_after.size(), high.size()) << "step " << step;
    EXPECT_GE(low_after.size(), low.size()) << "step " << step;
    EXPECT_LE(high_after.size() + low_after.size(), high.size() + low.size() + 1);
    for (int p = 0; p < n; ++p) {
      if (p > candidate) {
        EXPECT_EQ(tier[p], Tier::kWindow) << "window token " << p;
      } else if (p < candidate) {
        EXPECT_GE(static_cast<int>(tier[p]), static_cast<int>(before[p])) << "token " << p;
      }
    }
  }
  for (int p : {3, 17, 40}) EXPECT_EQ(tier[p], Tier::kHigh) << "heavy hitter " << p;
  EXPECT_GT(pruned_in_decode, 0);
  EXPECT_GT(demoted, 0);
  EXPECT_GT(members(Tier::kPruned).size(), 0u);
}

}  // namespace
}  // namespace strata::kv::leankv
