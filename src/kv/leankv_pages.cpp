#include "strata/kv/leankv_pages.h"

#include <algorithm>

#include "strata/common/check.h"

namespace strata::kv::leankv {
namespace {

int32_t* row(const PageManagerState& s, int32_t entry) {
  STRATA_CHECK(entry >= 0 && entry < s.num_entries) << "entry " << entry;
  return s.tables + int64_t{entry} * s.table_width;
}

int32_t* counts(const PageManagerState& s, int32_t entry) { return s.counts + int64_t{entry} * 2; }

// Appends a page id to the ring's free region.
void give_back(const PageManagerState& s, int32_t page) {
  const int64_t at = s.counters[kRecycled]++;
  s.ring[at % s.num_pages] = page;
}

}  // namespace

void init_pages(const PageManagerState& s) {
  for (int64_t p = 0; p < s.num_pages; ++p) s.ring[p] = static_cast<int32_t>(p);
  s.counters[kAllocated] = 0;
  s.counters[kRecycled] = s.num_pages;
  s.counters[kShortfall] = 0;
  for (int64_t i = 0; i < s.num_entries * s.table_width; ++i) s.tables[i] = -1;
  for (int64_t i = 0; i < s.num_entries * 2; ++i) s.counts[i] = 0;
}

void allocate_pages(const PageManagerState& s, const PageBatch& b) {
  int64_t total = 0;
  for (int64_t i = 0; i < b.n; ++i) total += b.amounts[2 * i] + b.amounts[2 * i + 1];
  const int64_t free = s.counters[kRecycled] - s.counters[kAllocated];
  if (total > free) {
    s.counters[kShortfall] = total - free;
    return;
  }
  const int64_t w = s.table_width;
  for (int64_t i = 0; i < b.n; ++i) {
    int32_t* table = row(s, b.entries[i]);
    int32_t* count = counts(s, b.entries[i]);
    const int32_t high = b.amounts[2 * i], low = b.amounts[2 * i + 1];
    STRATA_CHECK(high >= 0 && low >= 0 && count[kHigh] + high + count[kLow] + low <= w)
        << "entry " << b.entries[i] << " cannot take (" << high << ", " << low << ") pages";
    for (int32_t k = 0; k < high; ++k) {
      table[count[kHigh]++] = s.ring[s.counters[kAllocated]++ % s.num_pages];
    }
    for (int32_t k = 0; k < low; ++k) {
      table[w - 1 - count[kLow]++] = s.ring[s.counters[kAllocated]++ % s.num_pages];
    }
  }
  s.counters[kShortfall] = 0;
}

void release_pages(const PageManagerState& s, const PageBatch& b) {
  const int64_t w = s.table_width;
  for (int64_t i = 0; i < b.n; ++i) {
    int32_t* table = row(s, b.entries[i]);
    int32_t* count = counts(s, b.entries[i]);
    const int32_t high = b.amounts[2 * i], low = b.amounts[2 * i + 1];
    STRATA_CHECK(high >= 0 && low >= 0 && high <= count[kHigh] && low <= count[kLow])
        << "entry " << b.entries[i] << " holds (" << count[kHigh] << ", " << count[kLow]
        << ") pages, not (" << high << ", " << low << ")";
    for (int32_t k = count[kHigh] - high; k < count[kHigh]; ++k) {
      give_back(s, table[k]);
      table[k] = -1;
    }
    for (int32_t j = count[kLow] - low; j < count[kLow]; ++j) {
      give_back(s, table[w - 1 - j]);
      table[w - 1 - j] = -1;
    }
    count[kHigh] -= high;
    count[kLow] -= low;
  }
}

void split_pages(const PageManagerState& s, const PageBatch& b) {
  const int64_t w = s.table_width;
  for (int64_t i = 0; i < b.n; ++i) {
    int32_t* table = row(s, b.entries[i]);
    int32_t* count = counts(s, b.entries[i]);
    const int32_t c = count[kHigh];
    const int32_t keep_high = b.amounts[2 * i], keep_low = b.amounts[2 * i + 1];
    STRATA_CHECK(count[kLow] == 0 && keep_high >= 0 && keep_low >= 0 && keep_high + keep_low <= c)
        << "entry " << b.entries[i] << " holding (" << c << ", " << count[kLow]
        << ") pages cannot keep (" << keep_high << ", " << keep_low << ")";
    for (int32_t k = keep_high; k < c - keep_low; ++k) give_back(s, table[k]);
    // Moving right never overwrites a page still to be moved (c <= w).
    for (int32_t j = 0; j < keep_low; ++j) table[w - 1 - j] = table[c - 1 - j];
    for (int64_t k = keep_high; k < std::min<int64_t>(c, w - keep_low); ++k) table[k] = -1;
    count[kHigh] = keep_high;
    count[kLow] = keep_low;
  }
}

}  // namespace strata::kv::leankv
