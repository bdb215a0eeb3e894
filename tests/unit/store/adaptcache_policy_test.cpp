// AdaptCache's placement: the digest's hand-computed example (../shared/papers/adaptcache.md,
// §5.2 test 1), dominated options, the greedy against the exhaustive optimum on random
// single-tier instances, the capacity invariant over random two-tier instances, hot entries kept
// near under Zipf reuse, and the reuse-frequency estimate.
#include "strata/store/adaptcache_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace strata::store::adaptcache {
namespace {

constexpr int64_t kGB = 1'000'000'000;

// DRAM (25 GB/s) over SSD (1 GB/s); codecs none and KIVI-2 (rate 0.19, quality 0.95), alpha 1.
Profile digest_profile(int64_t dram_bytes, int64_t ssd_bytes) {
  Profile p;
  p.tiers = {{"dram", dram_bytes, 25.0 * kGB, 0}, {"ssd", ssd_bytes, 1.0 * kGB, 0}};
  p.codecs = {{"none", Method::kNone, 1.0, 0}, {"kivi-2", Method::kKivi, 0.19, 0}};
  p.tasks = {"qa"};
  p.quality = {{1.0, 0.95}};
  p.alpha = 1.0;
  return p;
}

Entry entry(ItemId id, double frequency, const Profile& p, int64_t raw = kGB) {
  Entry e;
  e.id = id;
  e.raw_bytes = raw;
  for (const CodecProfile& c : p.codecs) e.codec_bytes.push_back(std::llround(c.rate * raw));
  e.frequency = frequency;
  e.prefill_seconds = 10;
  e.current = {0, 0};
  return e;
}

TEST(AdaptCachePolicyTest, UtilitiesOfTheDigestExample) {
  const Profile p = digest_profile(kGB, 100 * kGB);
  ASSERT_TRUE(p.validate().ok());
  const Entry a = entry(1, 5, p), b = entry(2, 1, p);
  EXPECT_NEAR(utility(p, a, {0, 0}), 4.8, 1e-9);     // 5 * (1 - 1/25)
  EXPECT_NEAR(utility(p, a, {0, 1}), 4.712, 1e-9);   // 5 * (0.95 - 0.19/25)
  EXPECT_NEAR(utility(p, b, {0, 0}), 0.96, 1e-9);
  EXPECT_NEAR(utility(p, b, {0, 1}), 0.9424, 1e-9);
  EXPECT_NEAR(utility(p, a, {1, 1}), 5 * 0.76, 1e-9);  // KIVI on SSD: 0.95 - 0.19
  EXPECT_NEAR(utility(p, b, {1, 1}), 0.76, 1e-9);
  EXPECT_NEAR(utility(p, b, {kEvicted, 0}), 1 - 10, 1e-9);
}

TEST(AdaptCachePolicyTest, ReproducesTheDigestExampleStepByStep) {
  const Profile p = digest_profile(kGB, 100 * kGB);
  // A arrives alone: it fits in full quality.
  Plan first = place(p, {entry(1, 5, p)});
  EXPECT_TRUE(first.moves.empty());
  EXPECT_EQ(first.options[0], (Option{0, 0}));
  // B arrives: 2 GB in a 1 GB DRAM. Step 1 compresses B (0.0217 per GB freed), step 2 compresses
  // A (0.109 per GB) rather than demoting the compressed B to SSD (0.96 per GB).
  Plan second = place(p, {entry(1, 5, p), entry(2, 1, p)});
  ASSERT_EQ(second.moves.size(), 2u);
  EXPECT_EQ(second.moves[0].id, 2u);
  EXPECT_EQ(second.moves[0].to, (Option{0, 1}));
  EXPECT_EQ(second.moves[1].id, 1u);
  EXPECT_EQ(second.moves[1].to, (Option{0, 1}));
  EXPECT_EQ(second.tier_bytes[0], 2 * std::llround(0.19 * kGB));  // 0.38 GB
  EXPECT_EQ(second.tier_bytes[1], 0);
  EXPECT_TRUE(second.fits);
}

TEST(AdaptCachePolicyTest, OverflowDemotesTheColdEntryAndTheSsdPassEvicts) {
  // DRAM holds one compressed entry; SSD holds one too. Three entries: the hottest stays in
  // DRAM, the next goes to SSD, the coldest is evicted (its SSD utility is below the one moved).
  const Profile p = digest_profile(std::llround(0.19 * kGB), std::llround(0.19 * kGB));
  std::vector<Entry> entries = {entry(1, 5, p), entry(2, 2, p), entry(3, 1, p)};
  const Plan plan = place(p, entries);
  EXPECT_EQ(plan.options[0], (Option{0, 1}));
  EXPECT_EQ(plan.options[1], (Option{1, 1}));
  EXPECT_EQ(plan.options[2].tier, kEvicted);
  EXPECT_TRUE(plan.fits);
}

TEST(AdaptCachePolicyTest, CompressedEntriesKeepTheirMethodAndOnlyLowerTheirRate) {
  Profile p = digest_profile(kGB, kGB);
  p.codecs = {{"none", Method::kNone, 1.0, 0},
              {"kivi-4", Method::kKivi, 0.31, 0},
              {"kivi-2", Method::kKivi, 0.19, 0},
              {"streaming-0.5", Method::kStreaming, 0.5, 0}};
  p.quality = {{1.0, 0.98, 0.95, 0.9}};
  Entry e = entry(1, 1, p);
  for (int32_t c = 0; c < 4; ++c) EXPECT_TRUE(reachable(p, e, {0, c})) << c;
  e.current = {0, 1};  // kivi-4
  EXPECT_FALSE(reachable(p, e, {0, 0}));
  EXPECT_TRUE(reachable(p, e, {1, 1}));
  EXPECT_TRUE(reachable(p, e, {0, 2}));
  EXPECT_FALSE(reachable(p, e, {0, 3}));
  EXPECT_TRUE(reachable(p, e, {kEvicted, 0}));
  e.current = {1, 0};  // held below the nearest tier: keeps its codec there
  EXPECT_FALSE(reachable(p, e, {1, 2}));
  EXPECT_TRUE(reachable(p, e, {1, 0}));
  e.current = {kEvicted, 0};
  EXPECT_FALSE(reachable(p, e, {0, 0}));
}

TEST(AdaptCachePolicyTest, PinnedEntriesStayAndAnOverflowTheyCauseIsReported) {
  const Profile p = digest_profile(kGB / 2, kGB);
  std::vector<Entry> entries = {entry(1, 5, p), entry(2, 1, p)};
  entries[0].pinned = true;
  const Plan plan = place(p, entries);
  EXPECT_EQ(plan.options[0], (Option{0, 0}));
  EXPECT_NE(plan.options[1].tier, 0);
  EXPECT_FALSE(plan.fits);  // the pinned 1 GB alone exceeds 0.5 GB
}

// A random profile: `tiers` tiers, codecs none + 2 KIVI + 2 StreamingLLM rates, 2 tasks.
Profile random_profile(std::mt19937& rng, int tiers, int64_t capacity) {
  std::uniform_real_distribution<double> u(0, 1);
  Profile p;
  for (int t = 0; t < tiers; ++t) {
    TierProfile tier{"tier", capacity * (t + 1), (10.0 / (1 + 9 * t)) * kGB, 0.001 * t};
    tier.name += std::to_string(t);
    p.tiers.push_back(tier);
  }
  p.codecs = {{"none", Method::kNone, 1.0, 0},
              {"kivi-4", Method::kKivi, 0.31, 1e-11},
              {"kivi-2", Method::kKivi, 0.19, 2e-11},
              {"streaming-0.5", Method::kStreaming, 0.5, 0},
              {"streaming-0.1", Method::kStreaming, 0.1, 0}};
  p.tasks = {"a", "b"};
  for (int task = 0; task < 2; ++task) {
    const double k4 = 0.9 + 0.1 * u(rng), k2 = k4 * (0.7 + 0.3 * u(rng));
    const double s5 = 0.6 + 0.4 * u(rng), s1 = s5 * (0.3 + 0.7 * u(rng));
    p.quality.push_back({1.0, k4, k2, s5, s1});
  }
  p.alpha = 0.5 + 4 * u(rng);
  return p;
}

std::vector<Entry> random_entries(std::mt19937& rng, const Profile& p, int n) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<Entry> entries;
  for (int i = 0; i < n; ++i) {
    Entry e = entry(static_cast<ItemId>(i + 1), 0.1 + 5 * u(rng), p,
                    static_cast<int64_t>((0.2 + u(rng)) * kGB));
    e.task = i % 2;
    e.prefill_seconds = 0.2 + 2 * u(rng);
    entries.push_back(e);
  }
  return entries;
}

double total_utility(const Profile& p, const std::vector<Entry>& entries,
                     const std::vector<Option>& options) {
  double sum = 0;
  for (size_t i = 0; i < entries.size(); ++i) sum += utility(p, entries[i], options[i]);
  return sum;
}

TEST(AdaptCachePolicyTest, GreedyIsWithinOneIncrementOfTheExhaustiveOptimumOnOneTier) {
  std::mt19937 rng(7);
  for (int instance = 0; instance < 150; ++instance) {
    Profile p = random_profile(rng, 1, static_cast<int64_t>(1.2 * kGB));
    std::vector<Entry> entries = random_entries(rng, p, 5);
    // Each entry arrives at its best option in the tier (the greedy's starting point).
    double bound = 0;  // the largest utility step of one entry
    for (Entry& e : entries) {
      double best = -1e300, worst = 1e300;
      for (int32_t c = 0; c < 5; ++c) {
        const double u = utility(p, e, {0, c});
        worst = std::min({worst, u, utility(p, e, {kEvicted, 0})});
        if (u > best) {
          best = u;
          e.current = {0, c};
        }
      }
      bound = std::max(bound, best - worst);
    }
    const Plan plan = place(p, entries);
    ASSERT_TRUE(plan.fits);
    ASSERT_LE(plan.tier_bytes[0], p.tiers[0].capacity_bytes);
    // Exhaustive: every entry at any DRAM codec its start can reach, or evicted.
    double optimum = -1e300;
    std::vector<Option> choice(entries.size());
    std::function<void(size_t, int64_t)> search = [&](size_t i, int64_t used) {
      if (used > p.tiers[0].capacity_bytes) return;
      if (i == entries.size()) {
        optimum = std::max(optimum, total_utility(p, entries, choice));
        return;
      }
      choice[i] = {kEvicted, 0};
      search(i + 1, used);
      for (int32_t c = 0; c < 5; ++c) {
        if (!reachable(p, entries[i], {0, c})) continue;
        choice[i] = {0, c};
        search(i + 1, used + entries[i].codec_bytes[c]);
      }
    };
    search(0, 0);
    const double greedy = total_utility(p, entries, plan.options);
    EXPECT_LE(greedy, optimum + 1e-9) << instance;
    EXPECT_GE(greedy, optimum - bound - 1e-9) << instance;
  }
}

TEST(AdaptCachePolicyTest, ADominatedOptionIsNeverApplied) {
  std::mt19937 rng(11);
  for (int instance = 0; instance < 100; ++instance) {
    Profile p = random_profile(rng, 2, static_cast<int64_t>(1.0 * kGB));
    // streaming-0.5 keeps more bytes than kivi-4 yet loses more quality: dominated.
    for (auto& q : p.quality) q[3] = q[1] - 0.05;
    for (auto& c : p.codecs) c.decode_seconds_per_byte = 0;
    const Plan plan = place(p, random_entries(rng, p, 8));
    for (const Option& o : plan.options) EXPECT_FALSE(o.tier != kEvicted && o.codec == 3) << instance;
  }
}

TEST(AdaptCachePolicyTest, NoTierExceedsItsCapacityAndEveryMoveIsReachable) {
  std::mt19937 rng(3);
  for (int instance = 0; instance < 200; ++instance) {
    Profile p = random_profile(rng, 2, static_cast<int64_t>((0.5 + instance % 4) * kGB));
    std::vector<Entry> entries = random_entries(rng, p, 12);
    for (size_t i = 0; i < entries.size(); ++i) {  // some already placed, compressed or below
      if (i % 3 == 1) entries[i].current = {1, static_cast<int32_t>(i % 5)};
    }
    const Plan plan = place(p, entries);
    ASSERT_TRUE(plan.fits);
    std::vector<int64_t> bytes(2, 0);
    for (size_t i = 0; i < entries.size(); ++i) {
      const Option& o = plan.options[i];
      if (o.tier != kEvicted) bytes[o.tier] += entries[i].codec_bytes[o.codec];
    }
    EXPECT_EQ(bytes, plan.tier_bytes);
    for (int t = 0; t < 2; ++t) EXPECT_LE(bytes[t], p.tiers[t].capacity_bytes) << instance;
    for (const Move& m : plan.moves) {
      Entry e = entries[m.id - 1];
      e.current = m.from;
      EXPECT_TRUE(reachable(p, e, m.to)) << instance;
      if (m.from.tier != kEvicted && m.to.tier != kEvicted) {
        EXPECT_GE(m.to.tier, m.from.tier);
      }
    }
  }
}

TEST(AdaptCachePolicyTest, HotEntriesStayNearUnderZipfReuse) {
  std::mt19937 rng(5);
  Profile p = random_profile(rng, 2, 4 * kGB);  // DRAM 4 GB, SSD 8 GB for 40 GB of entries
  std::vector<Entry> entries = random_entries(rng, p, 40);
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].raw_bytes = kGB;
    for (size_t c = 0; c < p.codecs.size(); ++c) {
      entries[i].codec_bytes[c] = std::llround(p.codecs[c].rate * kGB);
    }
    entries[i].frequency = 10.0 / static_cast<double>(i + 1);  // Zipf, s = 1
  }
  const Plan plan = place(p, entries);
  ASSERT_TRUE(plan.fits);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(plan.options[i].tier, 0) << "hot entry " << i;
  for (size_t i = 35; i < 40; ++i) EXPECT_NE(plan.options[i].tier, 0) << "cold entry " << i;
  // Compression lets DRAM serve more of the reuse mass than whole entries would (4 of 40).
  double near = 0, whole = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (plan.options[i].tier == 0) near += entries[i].frequency;
    if (i < 4) whole += entries[i].frequency;
  }
  EXPECT_GT(near, whole);
}

TEST(AdaptCachePolicyTest, ProfileValidationNamesTheProblem) {
  Profile p = digest_profile(kGB, kGB);
  EXPECT_TRUE(p.validate().ok());
  Profile bad = p;
  bad.codecs[0].method = Method::kKivi;
  EXPECT_NE(bad.validate().message().find("codecs[0]"), std::string::npos);
  bad = p;
  bad.quality[0].pop_back();
  EXPECT_NE(bad.validate().message().find("qualities for"), std::string::npos);
  bad = p;
  bad.tiers[1].bandwidth = 0;
  EXPECT_NE(bad.validate().message().find("'ssd'"), std::string::npos);
  bad = p;
  bad.quality[0][1] = 1.5;
  EXPECT_FALSE(bad.validate().ok());
}

TEST(AdaptCachePolicyTest, ReuseFrequencyDecaysWithItsHalfLife) {
  ReuseCount r;
  record_use(&r, 0, 10);
  EXPECT_DOUBLE_EQ(r.count, 1);
  EXPECT_NEAR(decayed_count(r, 10, 10), 0.5, 1e-12);
  record_use(&r, 10, 10);
  EXPECT_NEAR(r.count, 1.5, 1e-12);
  // A steady rate of one use per second converges to rate * half_life / ln 2 counts.
  ReuseCount steady;
  for (int t = 0; t < 2000; ++t) record_use(&steady, t, 10);
  EXPECT_NEAR(uses_per_second(steady, 1999, 10), 1.0, 0.05);
}

}  // namespace
}  // namespace strata::store::adaptcache
