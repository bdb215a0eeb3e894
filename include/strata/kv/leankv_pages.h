// LeanKV's page manager (LeanKV §4.2-4.3, docs/leankv.md): the pages of the compressed KV pool
// handed out to *entries*, one entry per (request, layer, KV head), each with a two-ended page
// table (high-precision pages from the left end, low-precision pages from the right end) and all
// free page ids in a ring whose free region is always contiguous, so that one step's allocations
// and releases for every entry are an exclusive prefix sum and a parallel copy.
//
// The contract is framework-free (raw pointers over host or device memory) and has two
// implementations: the sequential one below (CPU deployments, and the reference) and the CUDA
// kernels behind kernels/ops.h's launch_leankv_* (one thread block, a block-wide scan), tested
// against each other under the CUDA block emulator (tests/kernels/emulated). Both produce
// bit-identical state for the same calls.
//
// State (PageManagerState), P = num_pages, W = table_width:
//   ring     [P] int32         a permutation of the page ids 0..P-1. The free ids are
//                              ring[(allocated + i) % P] for 0 <= i < recycled - allocated, in the
//                              order they will be handed out.
//   counters [kNumCounters] int64
//            [kAllocated]      pages ever handed out (monotone; the ring's read position)
//            [kRecycled]       P + pages ever given back (monotone; the ring's write position)
//            [kShortfall]      0 after an allocate that succeeded; after one that did not, how
//                              many pages it lacked (and the allocate changed nothing else)
//   tables   [num_entries, W] int32, entry e's row:
//              [0, high)            its high-precision pages, in the order they were appended
//              [W - low, W)         its low-precision pages, the j-th appended at W - 1 - j
//              everything else      -1
//   counts   [num_entries, 2] int32: (high, low) pages of each entry
// W must hold both ends at once: high + low <= W for every entry at every point (the callers size
// it, docs/leankv.md: ceil(max_tokens / high tokens per page) + 2).
//
// A step names the entries it changes (PageBatch): `entries` [n] distinct entry indices and
// `amounts` [n, 2] int32 whose meaning depends on the operation. Pages move to and from the ring
// in batch order: entry i's pages take the ring positions after those of entries 0..i-1.
#pragma once

#include <cstdint>

namespace strata::kv::leankv {

enum Counter : int { kAllocated = 0, kRecycled = 1, kShortfall = 2, kNumCounters = 3 };
enum Section : int { kHigh = 0, kLow = 1 };

struct PageManagerState {
  int32_t* ring = nullptr;
  int64_t* counters = nullptr;
  int32_t* tables = nullptr;
  int32_t* counts = nullptr;
  int64_t num_pages = 0;
  int64_t num_entries = 0;
  int64_t table_width = 0;
};

struct PageBatch {
  const int32_t* entries = nullptr;  // [n]
  const int32_t* amounts = nullptr;  // [n, 2]
  int64_t n = 0;
};

// Every page free, every table empty: ring = 0..P-1, counters {0, P, 0}, tables -1, counts 0.
void init_pages(const PageManagerState& state);

// Appends amounts[i] = (high, low) pages to entry i's two sections, taken from the ring. All or
// nothing: when the batch needs more pages than are free, nothing changes but
// counters[kShortfall] (set to the missing count). REQUIRES each entry's high + low <= W after.
void allocate_pages(const PageManagerState& state, const PageBatch& batch);

// Gives back the last amounts[i] = (high, low) pages of each section of entry i (the most
// recently appended ones) to the ring: the high ones in table order, then the low ones in the
// order they were appended.
// REQUIRES amounts <= counts. A finished request releases all of each of its entries' pages.
void release_pages(const PageManagerState& state, const PageBatch& batch);

// The prompt phase's compaction: an entry allocated c high pages as if every prompt token were
// high precision (counts (c, 0)) keeps amounts[i] = (kh, kl) of them: its first kh stay high, its
// last kl become its low section (the one at c - 1 - j becomes low page j), the ones between are
// given back in table order. REQUIRES counts (c, 0) and kh + kl <= c.
void split_pages(const PageManagerState& state, const PageBatch& batch);

}  // namespace strata::kv::leankv
