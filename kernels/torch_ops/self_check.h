// The start-up self-check: each of Strata's custom ops against its libtorch implementation on small
// inputs of the served model's shapes, on the serving device. An op whose kernel disagrees (or
// throws) is served by libtorch instead, and the report says so (/health, /metrics). The check
// takes the two implementations as tables, so CI runs the same check against the kernels under
// the CPU block emulator (tests/unit/kernels/self_check_test.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>

#include "strata/kernels/kernel_selection.h"
#include "strata/kernels/torch_ops.h"
#include "strata/kv/kv_format.h"

namespace strata::kernels {

// One implementation of every custom op, with torch_ops.h's contracts.
struct KernelOpTable {
  std::function<at::Tensor(const at::Tensor& x, const at::Tensor& weight, double eps)> rms_norm;
  std::function<at::Tensor(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin)>
      apply_rotary;
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& cu_q_lens, int64_t max_q_len, double scale)>
      paged_attention;
  std::function<void(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                     const at::Tensor& slot_mapping)>
      reshape_and_cache;
  // bytes [n, block_bytes] of `format` -> blocks [n, 2, heads, block_size, head_dim] of `dtype`.
  std::function<at::Tensor(const at::Tensor& bytes, const kv::KvFormat& format, int64_t heads,
                           int64_t block_size, int64_t head_dim, at::ScalarType dtype)>
      unpack_kv_blocks;
  // blocks [n, 2, heads, block_size, head_dim] -> bytes [n, block_bytes] of `format`.
  std::function<at::Tensor(const at::Tensor& blocks, const kv::KvFormat& format)> pack_kv_blocks;
  // FreeKV (freekv_ops.h's contracts).
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                           int64_t top_k, double scale)>
      freekv_select;
  std::function<void(const at::Tensor& rows_k, const at::Tensor& rows_v, at::Tensor& page,
                     at::Tensor& kmin, at::Tensor& kmax)>
      freekv_offload;
  std::function<void(const at::Tensor& chunks, const at::Tensor& items, at::Tensor& cache_k,
                     at::Tensor& cache_v, const at::Tensor& from_k, const at::Tensor& from_v)>
      freekv_recall;
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& resident_k,
                           const at::Tensor& resident_v, const at::Tensor& cache_k,
                           const at::Tensor& cache_v, const at::Tensor& slots, double scale)>
      freekv_attention;
  // Krul (torch_ops.h's krul_accumulate_rows): adds to the accumulators in place.
  std::function<void(const at::Tensor& rows, const at::Tensor& lengths, at::Tensor& squared,
                     at::Tensor& edge_mass)>
      krul_accumulate_rows;
  // LeanKV (torch_ops.h's leankv_* contracts).
  std::function<void(LeanKvPageOp op, at::Tensor& ring, at::Tensor& counters, at::Tensor& tables,
                     at::Tensor& counts, const at::Tensor& entries, const at::Tensor& amounts)>
      leankv_pages;
  std::function<void(at::Tensor& pool, const kv::leankv::PageFormat& format,
                     kv::leankv::Precision precision, const at::Tensor& page,
                     const at::Tensor& slot, const at::Tensor& key, const at::Tensor& value,
                     const at::Tensor& acc, const at::Tensor& position)>
      leankv_write_tokens;
  std::function<at::Tensor(const at::Tensor& q, at::Tensor& pool,
                           const kv::leankv::PageFormat& format, const at::Tensor& tables,
                           const at::Tensor& token_counts, const at::Tensor& entries,
                           const at::Tensor& window, const at::Tensor& window_lens,
                           at::Tensor& window_acc, int64_t max_tokens, double scale)>
      leankv_decode_attention;
  std::function<std::pair<at::Tensor, at::Tensor>(
      const at::Tensor& pool, const kv::leankv::PageFormat& format, const at::Tensor& tables,
      const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
      const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds)>
      leankv_settle_plan;
  std::function<void(at::Tensor& pool, const kv::leankv::PageFormat& format,
                     const at::Tensor& tables, at::Tensor& token_counts, const at::Tensor& entries,
                     const at::Tensor& actions, const at::Tensor& key, const at::Tensor& value,
                     const at::Tensor& acc, const at::Tensor& position)>
      leankv_settle_apply;
};

// torch_ops.h's functions with every op on `backend` (defined with the adapters, in
// strata_torch_ops: the production tables of the check).
KernelOpTable torch_ops_table(KernelBackend backend);

// The model shapes and serving dtype/device the check uses.
struct SelfCheckShape {
  int64_t hidden = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  at::ScalarType dtype = at::kBFloat16;
  at::Device device = at::kCPU;
};

// Runs every op of `strata` and of `reference` on the same seeded inputs (a few hundred tokens:
// decode, a prefill chunk over a cached prefix and a prefill in one attention batch; FreeKV's
// selection over 40 pages, an offload and recall round trip, a decode step over resident tokens
// and ragged recalled pages; Krul's decode-row statistics of two sequences; LeanKV's compression
// of a prompt's tokens into pages and a decode step over them) and compares them within the
// dtype's tolerance (exactly for the KV-cache write, FreeKV's selected pages and its
// copies). Each op's report names the backend that serves it: Strata when it matched, libtorch when
// it did not or threw.
KernelReport run_kernel_self_check(const KernelOpTable& strata, const KernelOpTable& reference,
                                   const SelfCheckShape& shape);

}  // namespace strata::kernels
