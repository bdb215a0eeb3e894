// Allocator of fixed-size slots (the 4 KiB pages of the DRAM arena or of the SSD tier's files) in
// a few large regions (one per file), handing out runs of consecutive slots (extents) so a value
// lands in few pieces and moves in few large I/Os.
//
// allocate(n) prefers the smallest single free extent that holds n slots (best fit); otherwise it
// assembles n slots from the largest extents first. free() coalesces with free neighbours, never
// across a region boundary (an extent never spans two files). Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace strata::store {

struct Extent {
  int64_t start = 0;
  int64_t length = 0;
  bool operator==(const Extent&) const = default;
};

class ExtentAllocator {
 public:
  // `regions`: disjoint slot ranges, all free at first.
  explicit ExtentAllocator(const std::vector<Extent>& regions);

  int64_t num_slots() const { return num_slots_; }
  int64_t num_free() const { return num_free_; }
  // Extents covering exactly n slots, or nullopt (nothing changes) if fewer than n are free.
  std::optional<std::vector<Extent>> allocate(int64_t n);
  // One extent of n slots (best fit), or nullopt (nothing changes) if no free extent holds n.
  std::optional<Extent> allocate_contiguous(int64_t n);
  // Returns slots to the free space. REQUIRES they are allocated.
  void free(Extent extent);
  // Takes specific slots out of the free space (rebuilding the allocation from a recovered
  // index). Returns false if any of them is not free.
  bool mark_used(Extent extent);
  // How many extents of n consecutive slots the free space holds at once (n > 0).
  int64_t count_contiguous(int64_t n) const;
  // Free extents in slot order (tests, diagnostics).
  std::vector<Extent> free_extents() const;

 private:
  std::map<int64_t, int64_t> free_;  // start -> length
  std::set<int64_t> region_starts_;
  int64_t num_slots_ = 0;
  int64_t num_free_ = 0;
};

}  // namespace strata::store
