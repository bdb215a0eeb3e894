// The custom ops run on CPU tensors by the kernels compiled for the block emulator
// (strata_kernels_emu), with torch_ops.h's contracts: what the emulator tests and the self-check
// test call. Device memory is host memory under the emulator, so CPU tensors' pointers go to the
// same launchers (ops.h) the CUDA adapters call.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "launch_params.h"
#include "self_check.h"
#include "strata/kernels/ops.h"

namespace strata::kernels::testing {

inline at::Tensor emulated_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor out = at::empty_like(x);
  launch_rms_norm(out.data_ptr(), x.data_ptr(), w.data_ptr(), x.size(0), x.size(1),
                  static_cast<float>(eps), dtype_of(x), nullptr);
  return out;
}

inline at::Tensor emulated_rotary(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin) {
  at::Tensor out = at::empty_like(x);
  launch_rotary(out.data_ptr(), x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.size(0), x.size(1),
                x.size(2), dtype_of(x), nullptr);
  return out;
}

// The split-K workspace is poisoned: a reduce that reads a partition nobody wrote sums NaN.
inline at::Tensor emulated_paged_attention(const at::Tensor& q, const at::Tensor& kv_cache,
                                           const at::Tensor& block_tables,
                                           const at::Tensor& seq_lens, const at::Tensor& cu_q_lens,
                                           int64_t max_q_len, double scale) {
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  PagedAttentionParams params =
      paged_attention_params(out, q, kv_cache, block_tables, seq_lens, cu_q_lens, max_q_len, scale);
  at::Tensor workspace;
  params.workspace_bytes = paged_attention_workspace_bytes(params);
  if (params.workspace_bytes > 0) {
    workspace = at::full({static_cast<int64_t>(params.workspace_bytes)}, 0xFF,
                         at::TensorOptions().dtype(at::kByte));
    params.workspace = workspace.data_ptr();
  }
  launch_paged_attention(params, nullptr);
  return out;
}

inline void emulated_reshape_and_cache(at::Tensor& kv_cache, const at::Tensor& key,
                                       const at::Tensor& value, const at::Tensor& slots) {
  launch_reshape_and_cache(reshape_and_cache_params(kv_cache, key, value, slots), nullptr);
}

inline at::Tensor emulated_unpack_kv_blocks(const at::Tensor& bytes, const kv::KvFormat& format,
                                            int64_t heads, int64_t block_size, int64_t head_dim,
                                            at::ScalarType dtype) {
  at::Tensor blocks = at::empty({bytes.size(0), 2, heads, block_size, head_dim}, dtype);
  at::Tensor in = bytes.contiguous();
  launch_unpack_kv_blocks(kv_blocks_params(blocks, in, format), nullptr);
  return blocks;
}

inline at::Tensor emulated_pack_kv_blocks(const at::Tensor& blocks, const kv::KvFormat& format) {
  at::Tensor in = blocks.contiguous();
  at::Tensor bytes = at::full(
      {blocks.size(0), kv::block_bytes(format, blocks.size(2), blocks.size(3), blocks.size(4))},
      0xA5, at::TensorOptions().dtype(at::kByte));
  launch_pack_kv_blocks(kv_blocks_params(in, bytes, format), nullptr);
  return bytes;
}

// FreeKV: outputs and workspaces start poisoned (NaN, -1), so an element the kernel leaves
// unwritten shows. The selection and the page scores it was made from.
inline std::pair<at::Tensor, at::Tensor> emulated_freekv_select_scores(const at::Tensor& q,
                                                                       const at::Tensor& kmin,
                                                                       const at::Tensor& kmax,
                                                                       int64_t top_k,
                                                                       double scale) {
  at::Tensor scores = at::full({kmin.size(1), kmin.size(0)}, NAN);
  at::Tensor selected = at::full({kmin.size(1), std::min(top_k, kmin.size(0))}, -1, at::kLong);
  FreeKvSelectParams params = freekv_select_params(scores, selected, q, kmin, kmax, scale);
  at::Tensor workspace =
      at::full({static_cast<int64_t>(freekv_select_workspace_bytes(params) / sizeof(float))}, NAN);
  params.workspace = workspace.data_ptr<float>();
  launch_freekv_select(params, nullptr);
  return {selected, scores};
}

inline at::Tensor emulated_freekv_select(const at::Tensor& q, const at::Tensor& kmin,
                                         const at::Tensor& kmax, int64_t top_k, double scale) {
  return emulated_freekv_select_scores(q, kmin, kmax, top_k, scale).first;
}

inline void emulated_freekv_offload(const at::Tensor& rows_k, const at::Tensor& rows_v,
                                    at::Tensor& page, at::Tensor& kmin, at::Tensor& kmax) {
  launch_freekv_offload(freekv_offload_params(rows_k, rows_v, page, kmin, kmax), nullptr);
}

inline void emulated_freekv_recall(const at::Tensor& chunks, const at::Tensor& items,
                                   at::Tensor& cache_k, at::Tensor& cache_v,
                                   const at::Tensor& from_k, const at::Tensor& from_v) {
  launch_freekv_recall(freekv_recall_params(chunks, items, cache_k, cache_v, from_k, from_v),
                       nullptr);
}

inline at::Tensor emulated_freekv_attention(const at::Tensor& q, const at::Tensor& resident_k,
                                            const at::Tensor& resident_v, const at::Tensor& cache_k,
                                            const at::Tensor& cache_v, const at::Tensor& slots,
                                            double scale) {
  at::Tensor out = at::full_like(q, NAN);
  FreeKvAttentionParams params =
      freekv_attention_params(out, q, resident_k, resident_v, cache_k, cache_v, slots, scale);
  at::Tensor workspace = at::full(
      {static_cast<int64_t>(freekv_attention_workspace_bytes(params) / sizeof(float))}, NAN);
  params.workspace = workspace.data_ptr<float>();
  launch_freekv_attention(params, nullptr);
  return out;
}

inline void emulated_krul_accumulate_rows(const at::Tensor& rows, const at::Tensor& lengths,
                                          at::Tensor& squared, at::Tensor& edge_mass) {
  launch_krul_accumulate_rows(krul_rows_params(rows, lengths, squared, edge_mass), nullptr);
}

// LeanKV: the page manager's kernels over the tensors' memory; the attention's workspace and
// the plan's outputs start poisoned.
// The page manager's state and a step's batch over CPU tensors (torch_ops.h's leankv_pages shapes).
inline kv::leankv::PageManagerState page_state(at::Tensor& ring, at::Tensor& counters,
                                               at::Tensor& tables, at::Tensor& counts) {
  return {ring.data_ptr<int32_t>(),
          counters.data_ptr<int64_t>(),
          tables.data_ptr<int32_t>(),
          counts.data_ptr<int32_t>(),
          ring.size(0),
          tables.size(0),
          tables.size(1)};
}
inline kv::leankv::PageBatch page_batch(const at::Tensor& entries, const at::Tensor& amounts) {
  return {entries.data_ptr<int32_t>(), amounts.data_ptr<int32_t>(), entries.numel()};
}

inline void emulated_leankv_pages(LeanKvPageOp op, at::Tensor& ring, at::Tensor& counters,
                                  at::Tensor& tables, at::Tensor& counts, const at::Tensor& entries,
                                  const at::Tensor& amounts) {
  const kv::leankv::PageManagerState state = page_state(ring, counters, tables, counts);
  const kv::leankv::PageBatch batch = page_batch(entries, amounts);
  if (op == LeanKvPageOp::kAllocate) launch_leankv_allocate(state, batch, nullptr);
  if (op == LeanKvPageOp::kRelease) launch_leankv_release(state, batch, nullptr);
  if (op == LeanKvPageOp::kSplit) launch_leankv_split(state, batch, nullptr);
}

inline void emulated_leankv_write_tokens(at::Tensor& pool, const kv::leankv::PageFormat& format,
                                         kv::leankv::Precision precision, const at::Tensor& page,
                                         const at::Tensor& slot, const at::Tensor& key,
                                         const at::Tensor& value, const at::Tensor& acc,
                                         const at::Tensor& position) {
  launch_leankv_write_tokens(
      leankv_write_params(pool, format, precision, page, slot, key, value, acc, position), nullptr);
}

inline at::Tensor emulated_leankv_decode_attention(
    const at::Tensor& q, at::Tensor& pool, const kv::leankv::PageFormat& format,
    const at::Tensor& tables, const at::Tensor& token_counts, const at::Tensor& entries,
    const at::Tensor& window, const at::Tensor& window_lens, at::Tensor& window_acc,
    int64_t max_tokens, double scale) {
  at::Tensor out = at::empty_like(q);
  LeanKvDecodeParams params =
      leankv_decode_params(out, q, pool, format, tables, token_counts, entries, window, window_lens,
                           window_acc, max_tokens, scale);
  at::Tensor workspace =
      at::full({static_cast<int64_t>(leankv_decode_workspace_bytes(params) / sizeof(float))}, NAN);
  params.workspace = workspace.data_ptr<float>();
  launch_leankv_decode_attention(params, nullptr);
  return out;
}

inline std::pair<at::Tensor, at::Tensor> emulated_leankv_settle_plan(
    const at::Tensor& pool, const kv::leankv::PageFormat& format, const at::Tensor& tables,
    const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
    const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds) {
  const int64_t m = entries.size(0);
  at::Tensor actions = at::full({m, 3}, -7, at::kInt), amounts = at::full({m, 2}, -7, at::kInt);
  at::Tensor bytes = pool, counts = token_counts;
  launch_leankv_settle_plan(
      leankv_settle_params(bytes, format, tables, counts, entries, lengths, candidate, thresholds,
                           actions, amounts, {}, {}, {}, {}),
      nullptr);
  return {actions, amounts};
}

inline void emulated_leankv_settle_apply(at::Tensor& pool, const kv::leankv::PageFormat& format,
                                         const at::Tensor& tables, at::Tensor& token_counts,
                                         const at::Tensor& entries, const at::Tensor& actions,
                                         const at::Tensor& key, const at::Tensor& value,
                                         const at::Tensor& acc, const at::Tensor& position) {
  at::Tensor a = actions, none;
  launch_leankv_settle_apply(
      leankv_settle_params(pool, format, tables, token_counts, entries, {}, {},
                           kv::leankv::Thresholds{}, a, none, key, value, acc, position),
      nullptr);
}

inline KernelOpTable emulated_kernel_table() {
  return {emulated_rms_norm,
          emulated_rotary,
          emulated_paged_attention,
          emulated_reshape_and_cache,
          emulated_unpack_kv_blocks,
          emulated_pack_kv_blocks,
          emulated_freekv_select,
          emulated_freekv_offload,
          emulated_freekv_recall,
          emulated_freekv_attention,
          emulated_krul_accumulate_rows,
          emulated_leankv_pages,
          emulated_leankv_write_tokens,
          emulated_leankv_decode_attention,
          emulated_leankv_settle_plan,
          emulated_leankv_settle_apply};
}

}  // namespace strata::kernels::testing
