#include "strata/store/extent_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace strata::store {
namespace {

TEST(ExtentAllocatorTest, BestFitThenLargestFirst) {
  ExtentAllocator a({{0, 10}, {10, 4}});  // two files
  EXPECT_EQ(a.num_slots(), 14);
  EXPECT_EQ(a.allocate(3).value(), (std::vector<Extent>{{10, 3}}));  // the smaller extent fits
  EXPECT_EQ(a.allocate(10).value(), (std::vector<Extent>{{0, 10}}));
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_FALSE(a.allocate(2).has_value());
  EXPECT_EQ(a.num_free(), 1);  // a failed allocation changes nothing
}

TEST(ExtentAllocatorTest, CountsTheRunsOfNSlotsTheFreeSpaceHolds) {
  ExtentAllocator a({{0, 10}, {100, 7}});
  EXPECT_EQ(a.count_contiguous(3), 3 + 2);
  ASSERT_TRUE(a.mark_used({4, 1}));  // free: [0, 4), [5, 10), [100, 107)
  EXPECT_EQ(a.count_contiguous(3), 1 + 1 + 2);
  EXPECT_EQ(a.count_contiguous(1), 16);
  EXPECT_EQ(a.count_contiguous(8), 0);
}

TEST(ExtentAllocatorTest, SplitsAcrossExtentsWhenNoneIsLargeEnough) {
  ExtentAllocator a({{0, 4}, {4, 4}});
  const std::vector<Extent> got = a.allocate(6).value();
  int64_t total = 0;
  for (const Extent& e : got) total += e.length;
  EXPECT_EQ(total, 6);
  EXPECT_EQ(got.size(), 2u);
}

TEST(ExtentAllocatorTest, FreeCoalescesButNotAcrossFiles) {
  ExtentAllocator a({{0, 4}, {4, 4}});
  a.allocate(4);
  a.allocate(4);
  a.free({2, 2});
  a.free({4, 2});
  a.free({0, 2});
  a.free({6, 2});
  EXPECT_EQ(a.free_extents(), (std::vector<Extent>{{0, 4}, {4, 4}}));
  EXPECT_EQ(a.num_free(), 8);
}

TEST(ExtentAllocatorTest, MarkUsedRebuildsAnAllocation) {
  ExtentAllocator a({{0, 8}});
  EXPECT_TRUE(a.mark_used({3, 1}));
  EXPECT_TRUE(a.mark_used({0, 1}));
  EXPECT_FALSE(a.mark_used({3, 1}));  // already used
  EXPECT_FALSE(a.mark_used({9, 1}));  // outside
  EXPECT_EQ(a.free_extents(), (std::vector<Extent>{{1, 2}, {4, 4}}));
}

TEST(ExtentAllocatorTest, RandomAllocateFreeNeverHandsOutASlotTwice) {
  ExtentAllocator a({{0, 64}, {64, 64}, {128, 32}});
  std::mt19937 rng(7);
  std::vector<std::vector<Extent>> held;
  std::set<int64_t> used;
  for (int step = 0; step < 2000; ++step) {
    if (!held.empty() && (rng() % 2 == 0)) {
      const size_t i = rng() % held.size();
      for (const Extent& e : held[i]) {
        for (int64_t s = e.start; s < e.start + e.length; ++s) used.erase(s);
        a.free(e);
      }
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (auto got = a.allocate(1 + static_cast<int64_t>(rng() % 9))) {
      for (const Extent& e : *got) {
        // An extent never spans a file boundary.
        auto file = [](int64_t slot) { return slot < 64 ? 0 : slot < 128 ? 1 : 2; };
        EXPECT_EQ(file(e.start), file(e.start + e.length - 1));
        for (int64_t s = e.start; s < e.start + e.length; ++s) EXPECT_TRUE(used.insert(s).second);
      }
      held.push_back(*got);
    }
    ASSERT_EQ(a.num_free() + static_cast<int64_t>(used.size()), 160);
  }
}

}  // namespace
}  // namespace strata::store
