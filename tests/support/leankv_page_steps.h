// Test helper for LeanKV's page manager (kv/leankv_pages.h): its state in host vectors, and random
// valid steps (allocate, release, split) drawn from the current counts, shared by the unit test
// of the sequential implementation and the emulator test of the CUDA kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "strata/kv/leankv_pages.h"

namespace strata::test_util {

struct HostPages {
  HostPages(int64_t num_pages, int64_t num_entries, int64_t table_width)
      : ring(num_pages),
        counters(kv::leankv::kNumCounters),
        tables(num_entries * table_width),
        counts(num_entries * 2),
        width(table_width) {
    kv::leankv::init_pages(state());
  }
  kv::leankv::PageManagerState state() {
    return {ring.data(),
            counters.data(),
            tables.data(),
            counts.data(),
            static_cast<int64_t>(ring.size()),
            static_cast<int64_t>(counts.size() / 2),
            width};
  }
  int64_t num_free() const {
    return counters[kv::leankv::kRecycled] - counters[kv::leankv::kAllocated];
  }
  int32_t high(int32_t e) const { return counts[2 * e]; }
  int32_t low(int32_t e) const { return counts[2 * e + 1]; }
  bool operator==(const HostPages&) const = default;

  std::vector<int32_t> ring;
  std::vector<int64_t> counters;
  std::vector<int32_t> tables;
  std::vector<int32_t> counts;
  int64_t width;
};

enum class PageOp { kAllocate, kRelease, kSplit };

struct PageStep {
  PageOp op = PageOp::kAllocate;
  std::vector<int32_t> entries;
  std::vector<int32_t> amounts;  // [n, 2]
  kv::leankv::PageBatch batch() const {
    return {entries.data(), amounts.data(), static_cast<int64_t>(entries.size())};
  }
};

// A valid step over up to max_entries distinct random entries. Allocations take 0-3 pages per
// section (prompt-sized ones, up to the table width, for empty entries), so some exceed the free
// pages; releases give back a random part or (request end) everything; splits keep a random
// high/low part of entries that hold only high pages.
inline PageStep random_page_step(const HostPages& pages, std::mt19937& rng, int64_t max_entries) {
  const int32_t num_entries = static_cast<int32_t>(pages.counts.size() / 2);
  std::vector<int32_t> all(num_entries);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  const int64_t n = std::uniform_int_distribution<int64_t>(0, max_entries)(rng);
  auto draw = [&](int32_t hi) {
    return std::uniform_int_distribution<int32_t>(0, std::max(0, hi))(rng);
  };
  PageStep step;
  step.op = static_cast<PageOp>(draw(2));
  const int32_t w = static_cast<int32_t>(pages.width);
  for (int32_t e : all) {
    if (static_cast<int64_t>(step.entries.size()) == n) break;
    const int32_t high = pages.high(e), low = pages.low(e);
    int32_t a = 0, b = 0;
    switch (step.op) {
      case PageOp::kAllocate:
        if (high + low == 0 && draw(3) == 0) {
          a = draw(w);
        } else {
          a = std::min(draw(3), w - high - low);
          b = std::min(draw(3), w - high - low - a);
        }
        break;
      case PageOp::kRelease:
        if (draw(3) == 0) {
          a = high, b = low;
        } else {
          a = draw(high), b = draw(low);
        }
        break;
      case PageOp::kSplit:
        if (low != 0 || high == 0) continue;
        a = draw(high);
        b = draw(high - a);
        break;
    }
    step.entries.push_back(e);
    step.amounts.push_back(a);
    step.amounts.push_back(b);
  }
  return step;
}

inline void apply_sequential(HostPages& pages, const PageStep& step) {
  switch (step.op) {
    case PageOp::kAllocate:
      kv::leankv::allocate_pages(pages.state(), step.batch());
      break;
    case PageOp::kRelease:
      kv::leankv::release_pages(pages.state(), step.batch());
      break;
    case PageOp::kSplit:
      kv::leankv::split_pages(pages.state(), step.batch());
      break;
  }
}

}  // namespace strata::test_util
