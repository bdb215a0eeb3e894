// LeanKV's decode step on the device (contract in ops.h, LeanKvSettleParams; the libtorch
// references are kernels::aten::leankv_settle_plan and leankv_settle_apply; Algorithm 1 itself is
// kv::leankv::decide, the same code on the host).
//
// Plan: one block per entry. Each thread walks a strided share of the entry's high tokens (then
// its low tokens) through the page table, scores each as acc / (length - 1 - position) and keeps
// the lowest (the lower index on ties); a warp shuffle and a pass over the warps' results give the
// tier's least significant token to thread 0, which decides and writes the action and the pages
// the growing section needs.
// Apply: one warp per entry. A demoted victim is read (dequantized into registers) before anything
// is written, requantized to the end of the low section, and the candidate then takes the
// victim's cell or the end of its section (token_rows.cuh's row functions, bit-identical to the
// reference's quantization); lane 0 moves accumulators and positions and updates the counts.

#include <cstdint>

#include "../common/dispatch.cuh"
#include "strata/kv/leankv_decision.h"
#include "token_rows.cuh"

namespace strata::kernels {
namespace {

using kv::leankv::DecodeAction;
using kv::leankv::PageSegments;
using kv::leankv::Tier;
using kv::leankv::TierMinimum;

constexpr int kPlanThreads = 128;
constexpr int kApplyWarps = 4;

// The lower of two candidates for a tier's least significant token (index -1: none).
__device__ __forceinline__ TierMinimum lower(TierMinimum a, TierMinimum b) {
  if (b.index < 0) return a;
  if (a.index < 0 || b.score < a.score || (b.score == a.score && b.index < a.index)) return b;
  return a;
}

// Page and slot of token i of an entry's section: high tokens fill the table from the left, low
// tokens from the right (kv/leankv_pages.h).
__device__ __forceinline__ void token_cell(const int32_t* table, int64_t width,
                                           const PageSegments& seg, bool high, int64_t i,
                                           int64_t* page, int* slot) {
  const int64_t column = high ? i / seg.tokens : width - 1 - i / seg.tokens;
  *page = table[column];
  *slot = static_cast<int>(i % seg.tokens);
}

// The least significant of the entry's n tokens of one section (valid in thread 0).
__device__ TierMinimum tier_minimum(const LeanKvSettleParams& p, const int32_t* table, bool high,
                                    int64_t n, int64_t length) {
  __shared__ float warp_score[kPlanThreads / 32];
  __shared__ int32_t warp_index[kPlanThreads / 32];
  const PageSegments& seg = high ? p.high : p.low;
  TierMinimum best;
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    int64_t page;
    int slot;
    token_cell(table, p.table_width, seg, high, t, &page, &slot);
    const unsigned char* base = p.pool + page * p.page_bytes;
    const float acc = reinterpret_cast<const float*>(base + seg.scores)[slot];
    const int32_t position = reinterpret_cast<const int32_t*>(base + seg.positions)[slot];
    best = lower(best, {acc / static_cast<float>(length - 1 - position), static_cast<int32_t>(t)});
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    TierMinimum other;
    other.score = __shfl_xor_sync(0xffffffffu, best.score, offset);
    other.index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    best = lower(best, other);
  }
  if (threadIdx.x % 32 == 0) {
    warp_score[threadIdx.x / 32] = best.score;
    warp_index[threadIdx.x / 32] = best.index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kPlanThreads / 32; ++w) {
      TierMinimum other;
      other.score = warp_score[w];
      other.index = warp_index[w];
      best = lower(best, other);
    }
  }
  __syncthreads();  // the warps' results are free for the next section
  return best;
}

__global__ void __launch_bounds__(kPlanThreads)
    leankv_settle_plan_kernel(const LeanKvSettleParams p) {
  const int64_t i = blockIdx.x;
  const int32_t e = p.entries[i];
  const int32_t* table = p.tables + e * p.table_width;
  const int64_t n_high = p.token_counts[2 * int64_t{e}];
  const int64_t n_low = p.token_counts[2 * int64_t{e} + 1];
  const int64_t length = p.lengths[i];
  const TierMinimum high = tier_minimum(p, table, true, n_high, length);
  const TierMinimum low = tier_minimum(p, table, false, n_low, length);
  if (threadIdx.x != 0) return;
  const DecodeAction a =
      kv::leankv::decide(p.candidate[i], high, low, length, p.alpha_high, p.alpha_low);
  int32_t* action = p.actions + 3 * i;
  action[0] = static_cast<int32_t>(a.candidate);
  action[1] = a.victim;
  action[2] = static_cast<int32_t>(a.victim_to);
  // The section that takes a token needs a page when it has filled its last one.
  int grows = -1;
  if (a.candidate != Tier::kPruned && a.victim < 0) grows = a.candidate == Tier::kHigh ? 0 : 1;
  if (a.candidate != Tier::kPruned && a.victim >= 0 && a.victim_to == Tier::kLow) grows = 1;
  const int64_t n = grows == 0 ? n_high : n_low;
  const int tokens = grows == 0 ? p.high.tokens : p.low.tokens;
  p.amounts[2 * i] = grows == 0 && n % tokens == 0 ? 1 : 0;
  p.amounts[2 * i + 1] = grows == 1 && n % tokens == 0 ? 1 : 0;
}

template <int D>
__global__ void __launch_bounds__(kApplyWarps * 32)
    leankv_settle_apply_kernel(const LeanKvSettleParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kApplyWarps + threadIdx.x / 32;
  if (i >= p.num_entries) return;  // whole warps leave together
  const int32_t* action = p.actions + 3 * i;
  if (action[0] == static_cast<int32_t>(Tier::kPruned)) return;
  const bool high = action[0] == static_cast<int32_t>(Tier::kHigh);
  const int32_t victim = action[1];
  const bool demote = victim >= 0 && action[2] == static_cast<int32_t>(Tier::kLow);
  const int32_t e = p.entries[i];
  const int32_t* table = p.tables + e * p.table_width;
  int32_t* count = p.token_counts + 2 * int64_t{e};
  const bool lane0 = threadIdx.x % 32 == 0;
  const PageSegments& seg = high ? p.high : p.low;
  const kv::leankv::PrecisionBits& bits = high ? p.high_bits : p.low_bits;
  int64_t page;
  int slot;
  token_cell(table, p.table_width, seg, high, victim >= 0 ? victim : count[high ? 0 : 1], &page,
             &slot);
  unsigned char* target = p.pool + page * p.page_bytes;
  if (demote) {  // victim (high) -> end of the low section, read before the candidate writes
    const int64_t low_index = count[1];
    float k[D / 32], v[D / 32];
    leankv_rows::load_row_bits<D>(p.high_bits.key, target, slot, p.high.tokens, p.high.key_data,
                                  p.high.key_params, k);
    leankv_rows::load_row_bits<D>(p.high_bits.value, target, slot, p.high.tokens, p.high.value_data,
                                  p.high.value_params, v);
    const float acc = reinterpret_cast<const float*>(target + p.high.scores)[slot];
    const int32_t position = reinterpret_cast<const int32_t*>(target + p.high.positions)[slot];
    __syncwarp();
    int64_t low_page;
    int low_slot;
    token_cell(table, p.table_width, p.low, false, low_index, &low_page, &low_slot);
    unsigned char* moved = p.pool + low_page * p.page_bytes;
    leankv_rows::store_row_bits<D>(p.low_bits.key, k, moved, low_slot, p.low.tokens, p.low.key_data,
                                   p.low.key_params);
    leankv_rows::store_row_bits<D>(p.low_bits.value, v, moved, low_slot, p.low.tokens,
                                   p.low.value_data, p.low.value_params);
    if (lane0) {
      reinterpret_cast<float*>(moved + p.low.scores)[low_slot] = acc;
      reinterpret_cast<int32_t*>(moved + p.low.positions)[low_slot] = position;
    }
  }
  float x[D / 32];
  leankv_rows::gather_row<D>(p.key, i, p.kind, x);
  leankv_rows::store_row_bits<D>(bits.key, x, target, slot, seg.tokens, seg.key_data,
                                 seg.key_params);
  leankv_rows::gather_row<D>(p.value, i, p.kind, x);
  leankv_rows::store_row_bits<D>(bits.value, x, target, slot, seg.tokens, seg.value_data,
                                 seg.value_params);
  __syncwarp();  // every lane read the counts before lane 0 moves them
  if (lane0) {
    reinterpret_cast<float*>(target + seg.scores)[slot] = p.acc[i];
    reinterpret_cast<int32_t*>(target + seg.positions)[slot] = p.position[i];
    if (victim < 0) ++count[high ? 0 : 1];
    if (demote) ++count[1];
  }
}

}  // namespace

void launch_leankv_settle_plan(const LeanKvSettleParams& params, cudaStream_t stream) {
  if (params.num_entries == 0) return;
  launch_kernel(leankv_settle_plan_kernel,
                {static_cast<unsigned>(params.num_entries), kPlanThreads, 0, stream}, params);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_leankv_settle_apply(const LeanKvSettleParams& params, cudaStream_t stream) {
  if (params.num_entries == 0) return;
  const unsigned blocks =
      static_cast<unsigned>((params.num_entries + kApplyWarps - 1) / kApplyWarps);
  STRATA_DISPATCH_HEAD_DIM(params.head_dim, [&] {
    launch_kernel(leankv_settle_apply_kernel<HEAD_DIM>, {blocks, kApplyWarps * 32, 0, stream},
                  params);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
