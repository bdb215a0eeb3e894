// LeanKV's page manager, sequential implementation (kv/leankv_pages.h): hand-worked cases (the
// paper's Figure 5), the all-or-nothing allocation, and a random stress run over 10^5 entries with
// the ring wrapping around many times, against a model in standard containers (a deque of free
// ids, two vectors per entry) and the invariants: every page is free or held exactly once, free
// plus held is P, everything is free when every entry has released.

#include "strata/kv/leankv_pages.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

#include "support/leankv_page_steps.h"

namespace strata::kv::leankv {
namespace {

using test_util::HostPages;
using test_util::PageOp;
using test_util::PageStep;

std::vector<int32_t> row(const HostPages& pages, int32_t e) {
  return {pages.tables.begin() + e * pages.width, pages.tables.begin() + (e + 1) * pages.width};
}

TEST(LeanKvPages, InitLeavesEveryPageFreeInOrder) {
  HostPages pages(6, 2, 4);
  EXPECT_EQ(pages.ring, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(pages.counters, (std::vector<int64_t>{0, 6, 0}));
  EXPECT_EQ(pages.tables, std::vector<int32_t>(8, -1));
  EXPECT_EQ(pages.counts, std::vector<int32_t>(4, 0));
}

// Figure 5: 8 prompt tokens, 2 high or 4 low tokens per page. Both heads allocate 4 pages as if
// all tokens were high; head 0 keeps 2 high tokens (1 page) and 4 low (1 page), head 1 keeps 3
// high (2 pages) and 2 low (1 page). Then a decode step appends a page to each head's low end.
TEST(LeanKvPages, PromptAllocationSplitsLikeFigure5) {
  HostPages pages(10, 2, 5);
  const std::vector<int32_t> entries = {0, 1};
  const std::vector<int32_t> conservative = {4, 0, 4, 0};
  allocate_pages(pages.state(), {entries.data(), conservative.data(), 2});
  EXPECT_EQ(row(pages, 0), (std::vector<int32_t>{0, 1, 2, 3, -1}));
  EXPECT_EQ(row(pages, 1), (std::vector<int32_t>{4, 5, 6, 7, -1}));
  EXPECT_EQ(pages.counters[kAllocated], 8);

  const std::vector<int32_t> keep = {1, 1, 2, 1};
  split_pages(pages.state(), {entries.data(), keep.data(), 2});
  EXPECT_EQ(row(pages, 0), (std::vector<int32_t>{0, -1, -1, -1, 3}));  // low page 0 was page 3
  EXPECT_EQ(row(pages, 1), (std::vector<int32_t>{4, 5, -1, -1, 7}));
  EXPECT_EQ(pages.counts, (std::vector<int32_t>{1, 1, 2, 1}));
  // Given back in table order, head 0's then head 1's, after the two never-used pages.
  EXPECT_EQ(pages.counters[kRecycled], 13);
  EXPECT_EQ(pages.ring, (std::vector<int32_t>{1, 2, 6, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(pages.num_free(), 5);  // ring[8], ring[9], ring[0..2]: 8 9 1 2 6

  const std::vector<int32_t> decode = {0, 1, 0, 1};
  allocate_pages(pages.state(), {entries.data(), decode.data(), 2});
  EXPECT_EQ(row(pages, 0), (std::vector<int32_t>{0, -1, -1, 8, 3}));
  EXPECT_EQ(row(pages, 1), (std::vector<int32_t>{4, 5, -1, 9, 7}));

  const std::vector<int32_t> finish = {1, 2, 2, 2};
  release_pages(pages.state(), {entries.data(), finish.data(), 2});
  EXPECT_EQ(pages.num_free(), 10);
  EXPECT_EQ(pages.tables, std::vector<int32_t>(10, -1));
}

TEST(LeanKvPages, AnAllocationThatDoesNotFitChangesNothing) {
  HostPages pages(4, 2, 4);
  const std::vector<int32_t> entries = {0, 1};
  const std::vector<int32_t> need = {2, 1, 1, 1};
  const HostPages before = pages;
  allocate_pages(pages.state(), {entries.data(), need.data(), 2});
  EXPECT_EQ(pages.counters[kShortfall], 1);
  pages.counters[kShortfall] = 0;
  EXPECT_EQ(pages, before);

  const std::vector<int32_t> fits = {2, 1, 1, 0};
  allocate_pages(pages.state(), {entries.data(), fits.data(), 2});
  EXPECT_EQ(pages.counters[kShortfall], 0);
  EXPECT_EQ(pages.num_free(), 0);
  EXPECT_EQ(row(pages, 0), (std::vector<int32_t>{0, 1, -1, 2}));
}

// The model: a FIFO of free ids and each entry's two sections as vectors (low in append order).
struct Model {
  explicit Model(int32_t num_pages, int32_t num_entries) : high(num_entries), low(num_entries) {
    for (int32_t p = 0; p < num_pages; ++p) free.push_back(p);
  }
  // Returns the shortfall of an allocation (0 when it was applied).
  int64_t apply(const PageStep& step) {
    const size_t n = step.entries.size();
    if (step.op == PageOp::kAllocate) {
      int64_t total = 0;
      for (size_t i = 0; i < 2 * n; ++i) total += step.amounts[i];
      if (total > static_cast<int64_t>(free.size()))
        return total - static_cast<int64_t>(free.size());
    }
    for (size_t i = 0; i < n; ++i) {
      std::vector<int32_t>& h = high[step.entries[i]];
      std::vector<int32_t>& l = low[step.entries[i]];
      const int32_t a = step.amounts[2 * i], b = step.amounts[2 * i + 1];
      switch (step.op) {
        case PageOp::kAllocate:
          for (int32_t k = 0; k < a; ++k) h.push_back(take());
          for (int32_t k = 0; k < b; ++k) l.push_back(take());
          break;
        case PageOp::kRelease:
          free.insert(free.end(), h.end() - a, h.end());
          free.insert(free.end(), l.end() - b, l.end());
          h.resize(h.size() - a);
          l.resize(l.size() - b);
          break;
        case PageOp::kSplit: {
          const int32_t c = static_cast<int32_t>(h.size());
          free.insert(free.end(), h.begin() + a, h.begin() + (c - b));
          for (int32_t j = 0; j < b; ++j) l.push_back(h[c - 1 - j]);
          h.resize(a);
          break;
        }
      }
    }
    return 0;
  }
  int32_t take() {
    const int32_t p = free.front();
    free.pop_front();
    return p;
  }
  std::deque<int32_t> free;
  std::vector<std::vector<int32_t>> high, low;
};

void expect_matches(const HostPages& pages, const Model& model) {
  const int64_t w = pages.width;
  const int64_t allocated = pages.counters[kAllocated];
  const int64_t p = static_cast<int64_t>(pages.ring.size());
  ASSERT_EQ(pages.num_free(), static_cast<int64_t>(model.free.size()));
  for (size_t i = 0; i < model.free.size(); ++i) {
    ASSERT_EQ(pages.ring[(allocated + static_cast<int64_t>(i)) % p], model.free[i]) << "free " << i;
  }
  std::vector<int32_t> expected(pages.tables.size(), -1);
  for (size_t e = 0; e < model.high.size(); ++e) {
    for (size_t k = 0; k < model.high[e].size(); ++k) expected[e * w + k] = model.high[e][k];
    for (size_t j = 0; j < model.low[e].size(); ++j) expected[e * w + w - 1 - j] = model.low[e][j];
    ASSERT_EQ(pages.high(static_cast<int32_t>(e)), static_cast<int32_t>(model.high[e].size()));
    ASSERT_EQ(pages.low(static_cast<int32_t>(e)), static_cast<int32_t>(model.low[e].size()));
  }
  ASSERT_EQ(pages.tables, expected);
}

// Every page id appears exactly once among the free ring positions and the held table slots.
void expect_partition(const HostPages& pages) {
  const int64_t p = static_cast<int64_t>(pages.ring.size());
  std::vector<int> seen(p, 0);
  for (int64_t i = 0; i < pages.num_free(); ++i)
    ++seen[pages.ring[(pages.counters[kAllocated] + i) % p]];
  int64_t held = 0;
  for (int32_t id : pages.tables) {
    if (id >= 0) ++seen[id], ++held;
  }
  EXPECT_EQ(pages.num_free() + held, p);
  for (int64_t id = 0; id < p; ++id) ASSERT_EQ(seen[id], 1) << "page " << id;
}

TEST(LeanKvPages, RandomStepsOverManyEntriesMatchTheModel) {
  constexpr int32_t kPages = 40000, kEntries = 100000, kWidth = 8;
  HostPages pages(kPages, kEntries, kWidth);
  Model model(kPages, kEntries);
  std::mt19937 rng(20261125);
  int shortfalls = 0;
  for (int step_index = 0; step_index < 300; ++step_index) {
    SCOPED_TRACE("step " + std::to_string(step_index));
    const PageStep step = test_util::random_page_step(pages, rng, 30000);
    const int64_t shortfall = model.apply(step);
    test_util::apply_sequential(pages, step);
    if (step.op == PageOp::kAllocate) {
      ASSERT_EQ(pages.counters[kShortfall], shortfall);
    }
    shortfalls += shortfall > 0;
    expect_matches(pages, model);
    if (step_index % 50 == 0) expect_partition(pages);
  }
  EXPECT_GT(shortfalls, 0) << "no allocation ever ran short";
  EXPECT_GT(pages.counters[kAllocated], 5 * kPages) << "the ring did not wrap around enough";
  expect_partition(pages);

  // Every request finishes: all pages free, every table empty.
  std::vector<int32_t> entries(kEntries);
  std::vector<int32_t> amounts(2 * kEntries);
  for (int32_t e = 0; e < kEntries; ++e) {
    entries[e] = e;
    amounts[2 * e] = pages.high(e);
    amounts[2 * e + 1] = pages.low(e);
  }
  release_pages(pages.state(), {entries.data(), amounts.data(), kEntries});
  EXPECT_EQ(pages.num_free(), kPages);
  EXPECT_EQ(pages.tables, std::vector<int32_t>(pages.tables.size(), -1));
  expect_partition(pages);
}

}  // namespace
}  // namespace strata::kv::leankv
