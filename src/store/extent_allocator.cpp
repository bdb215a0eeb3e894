#include "strata/store/extent_allocator.h"

#include <algorithm>

#include "strata/common/check.h"

namespace strata::store {

ExtentAllocator::ExtentAllocator(const std::vector<Extent>& regions) {
  for (const Extent& r : regions) {
    if (r.length <= 0) continue;
    free_.emplace(r.start, r.length);
    region_starts_.insert(r.start);
    num_slots_ += r.length;
  }
  num_free_ = num_slots_;
}

std::optional<std::vector<Extent>> ExtentAllocator::allocate(int64_t n) {
  STRATA_CHECK_LT(0, n);
  if (n > num_free_) return std::nullopt;
  if (std::optional<Extent> one = allocate_contiguous(n)) return std::vector<Extent>{*one};
  std::vector<Extent> out;
  while (n > 0) {
    auto largest = std::max_element(free_.begin(), free_.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
    const int64_t start = largest->first, length = largest->second;
    const int64_t count = std::min(n, length);
    free_.erase(largest);
    if (count < length) free_.emplace(start + count, length - count);
    out.push_back({start, count});
    num_free_ -= count;
    n -= count;
  }
  std::sort(out.begin(), out.end(), [](const Extent& a, const Extent& b) { return a.start < b.start; });
  return out;
}

std::optional<Extent> ExtentAllocator::allocate_contiguous(int64_t n) {
  STRATA_CHECK_LT(0, n);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= n && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) return std::nullopt;
  const Extent taken{best->first, n};
  const int64_t length = best->second;
  free_.erase(best);
  if (n < length) free_.emplace(taken.start + n, length - n);
  num_free_ -= n;
  return taken;
}

void ExtentAllocator::free(Extent extent) {
  STRATA_CHECK_LT(0, extent.length);
  int64_t start = extent.start, length = extent.length;
  auto next = free_.lower_bound(start);
  STRATA_CHECK(next == free_.end() || next->first >= start + length) << "double free of slot " << start;
  if (next != free_.end() && next->first == start + length && !region_starts_.contains(next->first)) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    STRATA_CHECK_LE(prev->first + prev->second, start) << "double free of slot " << start;
    if (prev->first + prev->second == start && !region_starts_.contains(start)) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, length);
  num_free_ += extent.length;
}

bool ExtentAllocator::mark_used(Extent extent) {
  auto it = free_.upper_bound(extent.start);
  if (it == free_.begin()) return false;
  --it;
  const int64_t start = it->first, length = it->second;
  if (extent.start + extent.length > start + length) return false;
  free_.erase(it);
  if (extent.start > start) free_.emplace(start, extent.start - start);
  const int64_t tail = start + length - (extent.start + extent.length);
  if (tail > 0) free_.emplace(extent.start + extent.length, tail);
  num_free_ -= extent.length;
  return true;
}

int64_t ExtentAllocator::count_contiguous(int64_t n) const {
  int64_t count = 0;
  for (const auto& [start, length] : free_) count += length / n;
  return count;
}

std::vector<Extent> ExtentAllocator::free_extents() const {
  std::vector<Extent> out;
  for (const auto& [start, length] : free_) out.push_back({start, length});
  return out;
}

}  // namespace strata::store
