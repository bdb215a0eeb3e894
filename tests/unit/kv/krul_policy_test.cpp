// Krul's selector and restoration planner (kv/krul_policy.h) against hand-computed cases and
// exhaustive searches over small instances.
#include "strata/kv/krul_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

namespace strata::kv::krul {
namespace {

// Statistics whose distances are given: one head, squared = d^2.
AttentionStats with_distances(int32_t layers, const std::function<double(int32_t, int32_t)>& d) {
  AttentionStats s(layers, 1);
  for (int32_t i = 0; i < layers; ++i) {
    s.edge_mass[static_cast<size_t>(i)] = 0.9;
    s.observed[static_cast<size_t>(i)] = 1;
    for (int32_t j = 0; j < i; ++j) s.squared_at(i, j, 0) = d(i, j) * d(i, j);
  }
  return s;
}

TEST(KrulPolicyTest, DistanceIsTheMeanOverHeadsOfPerHeadNorms) {
  AttentionStats s(3, 2);
  s.squared_at(2, 0, 0) = 9.0;   // 3
  s.squared_at(2, 0, 1) = 16.0;  // 4
  EXPECT_DOUBLE_EQ(s.distance(2, 0), 3.5);
  EXPECT_DOUBLE_EQ(s.distance(0, 2), 3.5);
  EXPECT_DOUBLE_EQ(s.distance(1, 1), 0.0);
  AttentionStats t(3, 2);
  t.squared_at(2, 0, 0) = 16.0;  // summed before the root: sqrt(25) = 5
  t.squared_at(2, 0, 1) = 0.0;
  s.add(t);
  EXPECT_DOUBLE_EQ(s.distance(2, 0), (5.0 + 4.0) / 2);
}

TEST(KrulPolicyTest, InitialRecentLayersAreThoseAtOrAboveGamma) {
  AttentionStats s(4, 2);
  const double mass[] = {0.3, 0.59, 0.6, 0.95};
  for (int32_t l = 0; l < 3; ++l) {
    s.edge_mass[static_cast<size_t>(l)] = mass[l] * 10;
    s.observed[static_cast<size_t>(l)] = 10;
  }
  // layer 3 never observed: not I-R whatever its mass
  s.edge_mass[3] = 5;
  EXPECT_EQ(initial_recent_layers(s, 0.6), (std::vector<bool>{false, false, true, false}));
  EXPECT_DOUBLE_EQ(s.edge_share(1), 0.59);
}

TEST(KrulPolicyTest, GreedyPairingTakesTheClosestDisjointPairsOfIrLayersOnly) {
  // 6 layers; layer 0 is not I-R. Distances: (1,2)=1, (2,3)=0.5, (4,5)=0.7, (1,4)=0.8,
  // (0,1)=0.1 (not a candidate: layer 0 is not I-R), everything else 5.
  auto d = [](int32_t i, int32_t j) {
    const int32_t a = std::min(i, j), b = std::max(i, j);
    if (a == 1 && b == 2) return 1.0;
    if (a == 2 && b == 3) return 0.5;
    if (a == 4 && b == 5) return 0.7;
    if (a == 1 && b == 4) return 0.8;
    if (a == 0 && b == 1) return 0.1;
    return 5.0;
  };
  AttentionStats s = with_distances(6, d);
  const std::vector<bool> ir = {false, true, true, true, true, true};
  // share 1: (2,3) 0.5, (4,5) 0.7, then (1,4) and (1,2) are blocked; (1, x) at 5 with x used:
  // layer 1 stays alone (every partner is used).
  std::vector<LayerPair> pairs = select_pairs(s, ir, 1.0);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].shallow, 2);
  EXPECT_EQ(pairs[0].deep, 3);
  EXPECT_EQ(pairs[1].shallow, 4);
  EXPECT_EQ(pairs[1].deep, 5);
  // share 1/3 of 6 layers = 2 layers: one pair.
  EXPECT_EQ(select_pairs(s, ir, 1.0 / 3).size(), 1u);
  // share 0.5 of 6 = 3: an odd target overshoots to 4 layers (two pairs), as Algorithm 1 does.
  EXPECT_EQ(select_pairs(s, ir, 0.5).size(), 2u);
  EXPECT_TRUE(select_pairs(s, ir, 0.0).empty());
}

TEST(KrulPolicyTest, PairsFormAMatchingOfTheRequestedSizeOnRandomInstances) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t layers = 2 + static_cast<int32_t>(rng() % 31);
    AttentionStats s = with_distances(layers, [&](int32_t, int32_t) { return u(rng); });
    std::vector<bool> ir(static_cast<size_t>(layers));
    int32_t ir_count = 0;
    for (auto&& b : ir) ir_count += (b = u(rng) < 0.75);
    const double share = u(rng);
    std::vector<LayerPair> pairs = select_pairs(s, ir, share);
    std::vector<int> uses(static_cast<size_t>(layers), 0);
    for (const LayerPair& p : pairs) {
      ASSERT_LT(p.shallow, p.deep);
      ASSERT_TRUE(ir[static_cast<size_t>(p.shallow)] && ir[static_cast<size_t>(p.deep)]);
      ++uses[static_cast<size_t>(p.shallow)];
      ++uses[static_cast<size_t>(p.deep)];
    }
    for (int c : uses) ASSERT_LE(c, 1);
    const int32_t used = 2 * static_cast<int32_t>(pairs.size());
    const int32_t target = static_cast<int32_t>(std::ceil(share * layers - 1e-12));
    // as many layers as asked (rounded up to a pair), unless the I-R layers ran out
    EXPECT_EQ(used, std::min(target + (target % 2), ir_count - ir_count % 2))
        << layers << " layers, share " << share << ", " << ir_count << " I-R";
    // greedy: each chosen pair is at most as far as any candidate still free when it was taken
    std::vector<bool> taken(static_cast<size_t>(layers), false);
    for (const LayerPair& p : pairs) {
      for (int32_t i = 0; i < layers; ++i) {
        for (int32_t j = 0; j < i; ++j) {
          if (ir[static_cast<size_t>(i)] && ir[static_cast<size_t>(j)] &&
              !taken[static_cast<size_t>(i)] && !taken[static_cast<size_t>(j)]) {
            ASSERT_LE(p.distance, s.distance(i, j));
          }
        }
      }
      taken[static_cast<size_t>(p.shallow)] = taken[static_cast<size_t>(p.deep)] = true;
    }
  }
}

TEST(KrulPolicyTest, MiniCacheAdjacentPairs) {
  std::vector<LayerPair> pairs = adjacent_pairs(16, 31);
  ASSERT_EQ(pairs.size(), 8u);
  EXPECT_EQ(pairs.front().shallow, 16);
  EXPECT_EQ(pairs.back().deep, 31);
}

TEST(KrulPolicyTest, PlansThatLeaveALayerWithoutHiddenStatesAreRejected) {
  EXPECT_TRUE(validate_plan({8, 8, 4, 0}, 8, {}).ok());
  Status s = validate_plan({8, 4, 6, 0}, 8, {});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer 2 recomputes 6 tokens but layer 1 only 4"), std::string::npos)
      << s.message();
  EXPECT_FALSE(validate_plan({9, 0}, 8, {}).ok());
  EXPECT_FALSE(validate_plan({2, 1, 0}, 8, {{0, 1, 0}, {1, 2, 0}}).ok());  // layer 1 twice
  EXPECT_FALSE(validate_plan({2, 1, 0}, 8, {{1, 1, 0}}).ok());
}

TEST(KrulPolicyTest, HandComputedPlanAndStorage) {
  // 4 layers, 100 tokens, compute 1 s/token, load 1.5 s/token, no attention term, no sharing:
  // the balanced ratio is x = 1.5 / 2.5 = 0.6 recomputed: 4 * 60 = 240 s each way.
  RestoreCosts c{1.0, 0.0, 1.5, 1.5};
  RestorePlan p = plan_restore(100, 4, {}, c, 1);
  ASSERT_TRUE(validate_plan(p.boundary, 100, {}).ok());
  // Linear costs: the balance recomputes 240 token-layers, deepest layers least (a pyramid).
  EXPECT_EQ(p.boundary, (std::vector<int64_t>{100, 100, 40, 0}));
  EXPECT_DOUBLE_EQ(p.compute_seconds, 240);
  EXPECT_DOUBLE_EQ(p.load_seconds, 240);
  // The fixed-ratio plan at the same ratio is the same times; storage (1 - r_c).
  RestorePlan f = fixed_ratio_plan(100, 4, 0.6, 1);
  time_plan(f, 100, {}, c);
  EXPECT_DOUBLE_EQ(f.compute_seconds, 240);
  EXPECT_DOUBLE_EQ(f.load_seconds, 240);
  EXPECT_DOUBLE_EQ(stored_fraction(f, 100, {}, c), 0.4);
  // One pair (2, 3) of 4 layers: P/N = 1/4, so the fixed plan stores (1 - 0.6)(1 - 1/4) = 0.3,
  // and its load stream idles (a bubble): 3 * 40 * 1.5 = 180 s against 240 s of compute.
  const std::vector<LayerPair> pair = {{2, 3, 0.0}};
  time_plan(f, 100, pair, c);
  EXPECT_DOUBLE_EQ(f.load_seconds, 180);
  EXPECT_DOUBLE_EQ(stored_fraction(f, 100, pair, c), 0.3);
  // Krul's plan spends the freed load time: both streams shorter than the fixed plan's compute.
  RestorePlan k = plan_restore(100, 4, pair, c, 1);
  ASSERT_TRUE(validate_plan(k.boundary, 100, pair).ok());
  EXPECT_LT(std::max(k.compute_seconds, k.load_seconds), 240 - 20);
  // By hand: the shallow layer 2 saves no load, so n2 = n3 = 0 and layers 0-1 recompute 180
  // token-layers: 180 = 1.5 (300 - 180), 180 s each way (1.33x shorter than the fixed plan).
  EXPECT_EQ(k.boundary, (std::vector<int64_t>{100, 80, 0, 0}));
  EXPECT_DOUBLE_EQ(k.compute_seconds, 180);
  EXPECT_DOUBLE_EQ(k.load_seconds, 180);
}

// The pass's other rows are on the compute stream: the plan recomputes only what their compute
// leaves of the loads, and nothing once it covers them all.
TEST(KrulPolicyTest, OtherComputeInThePassHidesLoadsToo) {
  RestoreCosts c{1.0, 0.0, 1.5, 1.5};
  c.other_compute = 100;  // of 600 s to load everything: the balance is 100 + 4x = 1.5 (400 - 4x)
  RestorePlan p = plan_restore(100, 4, {}, c, 1);
  ASSERT_TRUE(validate_plan(p.boundary, 100, {}).ok());
  EXPECT_EQ(std::accumulate(p.boundary.begin(), p.boundary.end(), int64_t{0}), 200);
  EXPECT_DOUBLE_EQ(p.compute_seconds, 300);
  EXPECT_DOUBLE_EQ(p.load_seconds, 300);
  c.other_compute = 600;  // covers every load: nothing is recomputed
  p = plan_restore(100, 4, {}, c, 1);
  EXPECT_EQ(p.boundary, (std::vector<int64_t>(4, 0)));
  EXPECT_DOUBLE_EQ(p.compute_seconds, 600);
  EXPECT_DOUBLE_EQ(p.load_seconds, 600);
}

// Every non-increasing boundary vector on the level grid, for the exhaustive comparison.
void enumerate(int32_t layers, const std::vector<int64_t>& level, std::vector<int64_t>& cur,
               const std::function<void(const std::vector<int64_t>&)>& f) {
  if (std::ssize(cur) == layers) {
    f(cur);
    return;
  }
  for (int64_t n : level) {
    if (!cur.empty() && n > cur.back()) continue;
    cur.push_back(n);
    enumerate(layers, level, cur, f);
    cur.pop_back();
  }
}

TEST(KrulPolicyTest, PlanIsWithinOneStepOfTheExhaustiveOptimum) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.1, 2.0);
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t layers = 2 + static_cast<int32_t>(rng() % 4);
    const int64_t tokens = 3 + static_cast<int64_t>(rng() % 6);
    RestoreCosts c{u(rng), u(rng) * 0.05, u(rng), 0};
    c.merged_load_per_token = c.load_per_token * u(rng);
    std::vector<LayerPair> pairs;
    if (layers >= 3 && rng() % 2) pairs.push_back({1, 2, 0.0});
    std::vector<int64_t> level;
    for (int64_t n = 0; n <= tokens; ++n) level.push_back(n);
    double optimum = 1e300, step = 0;
    std::vector<int64_t> cur;
    enumerate(layers, level, cur, [&](const std::vector<int64_t>& b) {
      RestorePlan p{b, 0, 0};
      time_plan(p, tokens, pairs, c);
      optimum = std::min(optimum, std::max(p.compute_seconds, p.load_seconds));
    });
    // one token more or less in one layer changes a stream by at most this much
    step = std::max(
        {c.compute_per_token + (2.0 * static_cast<double>(tokens) + 1) * c.attention_per_token2,
         c.load_per_token, c.merged_load_per_token});
    RestorePlan p = plan_restore(tokens, layers, pairs, c, 1);
    ASSERT_TRUE(validate_plan(p.boundary, tokens, pairs).ok());
    const double got = std::max(p.compute_seconds, p.load_seconds);
    EXPECT_GE(got, optimum - 1e-9);
    EXPECT_LE(got, optimum + step) << "trial " << trial;
  }
}

// A stored suffix lacks the KV before each layer's floor: the plan recomputes at least that, and
// is still the best such plan within one step.
TEST(KrulPolicyTest, PlansRecomputeAtLeastAStoredSuffixsFloorNearTheOptimumAboveIt) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<double> u(0.1, 2.0);
  int64_t binding = 0;  // trials where the floor changed the plan
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t layers = 2 + static_cast<int32_t>(rng() % 4);
    const int64_t tokens = 3 + static_cast<int64_t>(rng() % 6);
    const RestoreCosts c{u(rng), u(rng) * 0.05, u(rng), 0};
    std::vector<int64_t> floor(static_cast<size_t>(layers));
    for (int32_t l = 0; l < layers; ++l) {
      const int64_t above = l == 0 ? tokens : floor[l - 1];
      floor[l] = static_cast<int64_t>(rng() % static_cast<uint64_t>(above + 1));
    }
    std::vector<int64_t> level;
    for (int64_t n = 0; n <= tokens; ++n) level.push_back(n);
    double optimum = 1e300;
    std::vector<int64_t> cur;
    enumerate(layers, level, cur, [&](const std::vector<int64_t>& b) {
      for (int32_t l = 0; l < layers; ++l) {
        if (b[l] < floor[l]) return;
      }
      RestorePlan p{b, 0, 0};
      time_plan(p, tokens, {}, c);
      optimum = std::min(optimum, std::max(p.compute_seconds, p.load_seconds));
    });
    const double step = std::max(
        c.compute_per_token + (2.0 * static_cast<double>(tokens) + 1) * c.attention_per_token2,
        c.load_per_token);
    const RestorePlan p = plan_restore(tokens, layers, {}, c, 1, floor);
    ASSERT_TRUE(validate_plan(p.boundary, tokens, {}).ok());
    for (int32_t l = 0; l < layers; ++l) {
      EXPECT_GE(p.boundary[l], floor[l]) << "trial " << trial << " layer " << l;
    }
    const double got = std::max(p.compute_seconds, p.load_seconds);
    EXPECT_GE(got, optimum - 1e-9);
    EXPECT_LE(got, optimum + step) << "trial " << trial;
    binding += plan_restore(tokens, layers, {}, c, 1).boundary != p.boundary;
  }
  EXPECT_GT(binding, 10) << "the floors must constrain the plans in many trials";
}

TEST(KrulPolicyTest, PlansAreOnTheGranularityAndPyramidShaped) {
  // Attention makes recompute dearer per token the longer the prefix: still non-increasing.
  RestoreCosts c{1e-4, 1e-7, 2e-4, 2.2e-4};
  const std::vector<LayerPair> pairs = {{10, 11, 0}, {14, 15, 0}, {20, 22, 0}};
  RestorePlan p = plan_restore(1000, 30, pairs, c, 16);
  ASSERT_TRUE(validate_plan(p.boundary, 1000, pairs).ok());
  for (int64_t n : p.boundary) EXPECT_TRUE(n % 16 == 0 || n == 1000) << n;
  EXPECT_GT(p.boundary.front(), p.boundary.back());  // a pyramid, not a fixed ratio
  EXPECT_LT(std::abs(p.compute_seconds - p.load_seconds),
            0.1 * std::max(p.compute_seconds, p.load_seconds));
}

}  // namespace
}  // namespace strata::kv::krul
