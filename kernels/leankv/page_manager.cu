// LeanKV's page manager on the device (contract in include/strata/kv/leankv_pages.h; the
// sequential implementation there is the reference these kernels are tested against).
//
// One thread block per operation. Thread t owns a contiguous run of the batch's entries; the
// pages each run takes from (or gives to) the ring start at an exclusive prefix sum of the runs'
// page counts (one block-wide scan), so the whole step is one pass with no host round-trip. Ring
// positions and table slots of different entries are disjoint; the counters are read by every
// thread before the barrier and advanced by thread 0 after it.

#include <cstdint>

#include "../common/dispatch.cuh"
#include "strata/kv/leankv_pages.h"

namespace strata::kernels {
namespace {

using kv::leankv::kAllocated;
using kv::leankv::kHigh;
using kv::leankv::kLow;
using kv::leankv::kRecycled;
using kv::leankv::kShortfall;
using kv::leankv::PageBatch;
using kv::leankv::PageManagerState;

constexpr int kMaxThreads = 1024;

// This thread's run of batch entries: [*begin, *end).
__device__ __forceinline__ void my_run(int64_t n, int64_t* begin, int64_t* end) {
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  *begin = min(n, threadIdx.x * per);
  *end = min(n, *begin + per);
}

// Allocate and release: this thread's run, the ring offset of its first page (the batch's pages
// before its run) and the batch's pages in all, from amounts (high + low per entry).
__device__ __forceinline__ long long amounts_offset(const PageBatch& b, int64_t* begin,
                                                    int64_t* end, long long* total) {
  my_run(b.n, begin, end);
  long long mine = 0;
  for (int64_t i = *begin; i < *end; ++i) mine += b.amounts[2 * i] + b.amounts[2 * i + 1];
  return block_exclusive_scan(mine, total);
}

__global__ void __launch_bounds__(kMaxThreads)
    leankv_allocate_kernel(const PageManagerState s, const PageBatch b) {
  int64_t begin, end;
  long long total;
  long long at = amounts_offset(b, &begin, &end, &total);
  const int64_t allocated = s.counters[kAllocated];
  const int64_t free = s.counters[kRecycled] - allocated;
  if (total > free) {  // the same decision in every thread: nothing changes
    if (threadIdx.x == 0) s.counters[kShortfall] = total - free;
    return;
  }
  const int64_t w = s.table_width;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t e = b.entries[i];
    int32_t* table = s.tables + e * w;
    int32_t* count = s.counts + 2 * int64_t{e};
    const int32_t high = b.amounts[2 * i], low = b.amounts[2 * i + 1];
    for (int32_t k = 0; k < high; ++k) {
      table[count[kHigh] + k] = s.ring[(allocated + at++) % s.num_pages];
    }
    for (int32_t k = 0; k < low; ++k) {
      table[w - 1 - (count[kLow] + k)] = s.ring[(allocated + at++) % s.num_pages];
    }
    count[kHigh] += high;
    count[kLow] += low;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s.counters[kAllocated] = allocated + total;
    s.counters[kShortfall] = 0;
  }
}

__global__ void __launch_bounds__(kMaxThreads)
    leankv_release_kernel(const PageManagerState s, const PageBatch b) {
  int64_t begin, end;
  long long total;
  long long at = amounts_offset(b, &begin, &end, &total);
  const int64_t recycled = s.counters[kRecycled];
  const int64_t w = s.table_width;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t e = b.entries[i];
    int32_t* table = s.tables + e * w;
    int32_t* count = s.counts + 2 * int64_t{e};
    const int32_t high = b.amounts[2 * i], low = b.amounts[2 * i + 1];
    for (int32_t k = count[kHigh] - high; k < count[kHigh]; ++k) {
      s.ring[(recycled + at++) % s.num_pages] = table[k];
      table[k] = -1;
    }
    for (int32_t j = count[kLow] - low; j < count[kLow]; ++j) {
      s.ring[(recycled + at++) % s.num_pages] = table[w - 1 - j];
      table[w - 1 - j] = -1;
    }
    count[kHigh] -= high;
    count[kLow] -= low;
  }
  __syncthreads();
  if (threadIdx.x == 0) s.counters[kRecycled] = recycled + total;
}

__global__ void __launch_bounds__(kMaxThreads)
    leankv_split_kernel(const PageManagerState s, const PageBatch b) {
  int64_t begin, end;
  my_run(b.n, &begin, &end);
  long long mine = 0;
  for (int64_t i = begin; i < end; ++i) {
    mine += s.counts[2 * int64_t{b.entries[i]}] - b.amounts[2 * i] - b.amounts[2 * i + 1];
  }
  long long total;
  long long at = block_exclusive_scan(mine, &total);
  const int64_t recycled = s.counters[kRecycled];
  const int64_t w = s.table_width;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t e = b.entries[i];
    int32_t* table = s.tables + e * w;
    int32_t* count = s.counts + 2 * int64_t{e};
    const int32_t c = count[kHigh];
    const int32_t keep_high = b.amounts[2 * i], keep_low = b.amounts[2 * i + 1];
    for (int32_t k = keep_high; k < c - keep_low; ++k) {
      s.ring[(recycled + at++) % s.num_pages] = table[k];
    }
    for (int32_t j = 0; j < keep_low; ++j) table[w - 1 - j] = table[c - 1 - j];
    const int64_t clear_end = min(int64_t{c}, w - keep_low);
    for (int64_t k = keep_high; k < clear_end; ++k) table[k] = -1;
    count[kHigh] = keep_high;
    count[kLow] = keep_low;
  }
  __syncthreads();
  if (threadIdx.x == 0) s.counters[kRecycled] = recycled + total;
}

// One warp per 32 entries, at most kMaxThreads (a run per thread beyond that).
unsigned threads_for(int64_t n) {
  const int64_t warps = (n + 31) / 32;
  if (warps < 1) return 32;
  return static_cast<unsigned>(warps >= kMaxThreads / 32 ? kMaxThreads : warps * 32);
}

}  // namespace

void launch_leankv_allocate(const kv::leankv::PageManagerState& state,
                            const kv::leankv::PageBatch& batch, cudaStream_t stream) {
  launch_kernel(leankv_allocate_kernel, {1, threads_for(batch.n), 0, stream}, state, batch);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_leankv_release(const kv::leankv::PageManagerState& state,
                           const kv::leankv::PageBatch& batch, cudaStream_t stream) {
  launch_kernel(leankv_release_kernel, {1, threads_for(batch.n), 0, stream}, state, batch);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_leankv_split(const kv::leankv::PageManagerState& state,
                         const kv::leankv::PageBatch& batch, cudaStream_t stream) {
  launch_kernel(leankv_split_kernel, {1, threads_for(batch.n), 0, stream}, state, batch);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
