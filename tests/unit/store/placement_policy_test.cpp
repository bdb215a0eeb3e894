// Placement decisions of the KV store: the CachedAttention paper's worked example (Fig. 9) and a
// table per rule for the scheduler-aware policy and the LRU / FIFO baselines.
#include "strata/store/placement_policy.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace strata::store {
namespace {

// An item named after the job that will load it (item 4 is "Job 4's KV cache").
ItemView dram(ItemId id, uint64_t last_access = 0, uint64_t stored_at = 0) {
  return {id, 1, true, false, false, false, last_access, stored_at};
}
ItemView ssd(ItemId id, uint64_t last_access = 0, uint64_t stored_at = 0) {
  return {id, 1, false, true, true, false, last_access, stored_at};
}
ItemView both(ItemId id, uint64_t last_access = 0) {
  return {id, 1, true, true, false, false, last_access, 0};
}
ItemView pinned(ItemView v) {
  v.pinned = true;
  return v;
}

TEST(PlacementPolicyTest, ReproducesTheWorkedExampleOfFigure9) {
  // Job 1 runs; Jobs 2..9 wait. DRAM holds 3 items (2 + a 1-item buffer) with Jobs 2 and 4's
  // items; the disk holds 4 and is full with Jobs 3, 5, 6 and 9's. Jobs 7 and 8 are new
  // conversations (nothing stored). Every item is one chunk, so S_kv = 1.
  const std::vector<ItemId> queue = {2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<ItemView> items = {dram(2), dram(4), ssd(3), ssd(5), ssd(6), ssd(9)};
  const int64_t prefetch_window = window_length(/*C_mem=*/2, 1.0, 0);
  const int64_t eviction_window = window_length(/*C_mem + C_disk=*/2 + 4, 1.0, 0);
  ASSERT_EQ(prefetch_window, 2);
  ASSERT_EQ(eviction_window, 6);

  // Fetching: the window covers Jobs 2-3; Job 2's item is in DRAM, Job 3's is read from disk.
  EXPECT_EQ(prefetch_candidates(items, queue, prefetch_window), std::vector<ItemId>{3});
  items[2] = both(3);  // read into the DRAM buffer; the disk copy stays

  // Eviction DRAM -> SSD: every DRAM item (2, 3, 4) has a job in the window (Jobs 2-7), so the
  // window is scanned tail -> head: Jobs 7, 6, 5 have nothing in DRAM, Job 4 does.
  EXPECT_EQ(choose_top_victim(EvictionPolicy::kSchedulerAware, items, queue, eviction_window), 4u);

  // The disk is full: Jobs 3, 5, 6 are inside the window and exempt; Job 9, the last arrived and
  // outside the window, is dropped, and Job 4's item takes its place.
  EXPECT_EQ(choose_lower_victim(EvictionPolicy::kSchedulerAware, items, queue, eviction_window, 4),
            9u);
}

struct DramCase {
  std::string name;
  EvictionPolicy policy;
  std::vector<ItemView> items;
  std::vector<ItemId> queue;
  int64_t window;
  std::optional<ItemId> victim;
};

TEST(PlacementPolicyTest, DramVictims) {
  const std::vector<DramCase> cases = {
      {"no job in window beats queued items", EvictionPolicy::kSchedulerAware,
       {dram(1, 5), dram(2, 1), dram(3, 9)}, {2, 1}, 2, 3},
      {"without a job: least recently used first", EvictionPolicy::kSchedulerAware,
       {dram(1, 7), dram(2, 3), dram(3, 5)}, {}, 4, 2},
      {"a job beyond the window counts as none", EvictionPolicy::kSchedulerAware,
       {dram(1, 1), dram(2, 9)}, {1, 5, 6, 2}, 2, 2},
      {"all queued: nearest the window's tail", EvictionPolicy::kSchedulerAware,
       {dram(1), dram(2), dram(3)}, {3, 1, 2}, 3, 2},
      {"tail scan skips items not in DRAM", EvictionPolicy::kSchedulerAware,
       {dram(1), dram(2), ssd(3)}, {2, 1, 3}, 3, 1},
      {"pinned items are never victims", EvictionPolicy::kSchedulerAware,
       {pinned(dram(1)), dram(2)}, {2}, 1, 2},
      {"nothing evictable", EvictionPolicy::kSchedulerAware, {pinned(dram(1)), ssd(2)}, {}, 1,
       std::nullopt},
      {"lru ignores the queue", EvictionPolicy::kLru, {dram(1, 4), dram(2, 2), dram(3, 8)}, {2},
       3, 2},
      {"fifo: first stored", EvictionPolicy::kFifo, {dram(1, 1, 7), dram(2, 2, 3), dram(3, 3, 5)},
       {2}, 3, 2},
      {"lru skips pinned", EvictionPolicy::kLru, {pinned(dram(1, 1)), dram(2, 2)}, {}, 0, 2},
  };
  for (const DramCase& c : cases) {
    EXPECT_EQ(choose_top_victim(c.policy, c.items, c.queue, c.window), c.victim) << c.name;
  }
}

struct SsdCase {
  std::string name;
  EvictionPolicy policy;
  std::vector<ItemView> items;
  std::vector<ItemId> queue;
  int64_t window;
  std::optional<ItemId> exclude;
  std::optional<ItemId> victim;
};

TEST(PlacementPolicyTest, SsdVictims) {
  const std::vector<SsdCase> cases = {
      {"unqueued items go first, least recently used", EvictionPolicy::kSchedulerAware,
       {ssd(1, 9), ssd(2, 4), ssd(3, 1)}, {3}, 1, std::nullopt, 2},
      {"then the job farthest back outside the window", EvictionPolicy::kSchedulerAware,
       {ssd(1), ssd(2), ssd(3)}, {1, 2, 3}, 1, std::nullopt, 3},
      {"jobs inside the window are exempt", EvictionPolicy::kSchedulerAware, {ssd(1), ssd(2)},
       {1, 2}, 2, std::nullopt, std::nullopt},
      {"the demoted item is excluded", EvictionPolicy::kSchedulerAware, {ssd(1), ssd(2)}, {}, 0,
       ItemId{1}, 2},
      {"a DRAM-only item has no SSD copy to drop", EvictionPolicy::kSchedulerAware,
       {dram(1), ssd(2)}, {2}, 1, std::nullopt, std::nullopt},
      {"lru", EvictionPolicy::kLru, {ssd(1, 5), ssd(2, 2), both(3, 1)}, {3}, 3, std::nullopt, 3},
      {"fifo", EvictionPolicy::kFifo, {ssd(1, 1, 9), ssd(2, 2, 4)}, {2}, 2, std::nullopt, 2},
  };
  for (const SsdCase& c : cases) {
    EXPECT_EQ(choose_lower_victim(c.policy, c.items, c.queue, c.window, c.exclude), c.victim)
        << c.name;
  }
}

TEST(PlacementPolicyTest, PrefetchTakesDiskItemsOfTheWindowHeadFirst) {
  const std::vector<ItemView> items = {ssd(1), dram(2), ssd(3), pinned(ssd(4)), ssd(5), both(6)};
  EXPECT_EQ(prefetch_candidates(items, std::vector<ItemId>{5, 2, 3, 3, 4, 1}, 4),
            (std::vector<ItemId>{5, 3}));
  EXPECT_EQ(prefetch_candidates(items, std::vector<ItemId>{6, 7, 1}, 3), std::vector<ItemId>{1});
  EXPECT_TRUE(prefetch_candidates(items, std::vector<ItemId>{1}, 0).empty());
}

TEST(PlacementPolicyTest, WindowLengths) {
  EXPECT_EQ(window_length(100, 10.0, 0), 10);
  EXPECT_EQ(window_length(105, 10.0, 0), 10);
  EXPECT_EQ(window_length(5, 10.0, 0), 1);   // at least one entry
  EXPECT_EQ(window_length(0, 10.0, 7), 0);   // no capacity, no window
  EXPECT_EQ(window_length(50, 0.0, 7), 7);   // unknown item size: the fallback
}

TEST(PlacementPolicyTest, ReadBufferLayersFollowThePapersBound) {
  struct Case {
    int64_t layers;
    double t_compute, t_load;
    int64_t k;
  };
  for (const Case& c : std::vector<Case>{
           // The paper's check (§4.3.2, LLaMA-13B): loading takes 1.56x computing -> B15.
           {40, 1.0, 1.56, 15},
           {40, 1.0, 1.0, 1},   // perfect overlap: only the first layer's gap
           {40, 2.0, 1.0, 1},   // compute-bound: likewise
           {40, 0.0, 1.0, 40},  // nothing to compute: pre-load everything
           {30, 1.0, 3.0, 21},  // 30 - 29 / 3 = 20.33
           {1, 1.0, 5.0, 1},
           {40, 1.0, 0.0, 1},  // no load time measured yet
       }) {
    EXPECT_EQ(read_buffer_layers(c.layers, c.t_compute, c.t_load), c.k)
        << c.layers << " layers, t_c " << c.t_compute << ", t_l " << c.t_load;
  }
  // Brute force: the smallest k with (j - k) t_l <= (j - 1) t_c for all j.
  for (double ratio : {0.1, 0.3, 0.64, 0.9}) {
    int64_t smallest = 1;
    while (true) {
      bool stalls = false;
      for (int64_t j = 1; j <= 40; ++j) stalls |= (j - smallest) * 1.0 > (j - 1) * ratio + 1e-12;
      if (!stalls) break;
      ++smallest;
    }
    EXPECT_EQ(read_buffer_layers(40, ratio, 1.0), smallest) << "t_c / t_l = " << ratio;
  }
}

TEST(PlacementPolicyTest, ParsesPolicyNames) {
  for (EvictionPolicy p : {EvictionPolicy::kSchedulerAware, EvictionPolicy::kLru, EvictionPolicy::kFifo}) {
    EXPECT_EQ(parse_eviction_policy(eviction_policy_name(p)).value(), p);
  }
  EXPECT_FALSE(parse_eviction_policy("random").ok());
}

}  // namespace
}  // namespace strata::store
