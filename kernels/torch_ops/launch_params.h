// Launcher arguments (ops.h) from at::Tensors: pointers, sizes and strides, for any device. The
// CUDA adapters (torch_ops.cpp) pass them to the GPU launchers after their checks; the emulator
// tests (tests/kernels/emulated) pass CPU tensors' to the same launchers compiled for the CPU
// block emulator. No checks here: callers validate shapes and dtypes first.
#pragma once

#include <cstdint>

#include "strata/kernels/ops.h"
#include "strata/kv/kv_format.h"
#include "strata/kv/leankv_decision.h"

namespace at {
class Tensor;
}

namespace strata::kernels {

// float32 / float16 / bfloat16; throws c10::Error for any other dtype.
DType dtype_of(const at::Tensor& t);

// out: [num_tokens, num_heads, head_dim] contiguous, q's dtype. The workspace is left empty.
PagedAttentionParams paged_attention_params(at::Tensor& out, const at::Tensor& q,
                                            const at::Tensor& kv_cache,
                                            const at::Tensor& block_tables,
                                            const at::Tensor& seq_lens, const at::Tensor& cu_q_lens,
                                            int64_t max_q_len, double scale);

ReshapeAndCacheParams reshape_and_cache_params(at::Tensor& kv_cache, const at::Tensor& key,
                                               const at::Tensor& value,
                                               const at::Tensor& slot_mapping);

// out: [num_seqs, num_heads, head_dim] contiguous, q's dtype; max_tokens bounds every head's
// stored plus window tokens. The workspace is left empty.
LeanKvDecodeParams leankv_decode_params(at::Tensor& out, const at::Tensor& q, at::Tensor& pool,
                                        const kv::leankv::PageFormat& format,
                                        const at::Tensor& tables, const at::Tensor& token_counts,
                                        const at::Tensor& entries, const at::Tensor& window,
                                        const at::Tensor& window_lens, at::Tensor& window_acc,
                                        int64_t max_tokens, double scale);

// page, slot: [n] int64; key, value: [n, head_dim] contiguous; acc [n] float32; position [n] int32.
LeanKvWriteParams leankv_write_params(at::Tensor& pool, const kv::leankv::PageFormat& format,
                                      kv::leankv::Precision precision, const at::Tensor& page,
                                      const at::Tensor& slot, const at::Tensor& key,
                                      const at::Tensor& value, const at::Tensor& acc,
                                      const at::Tensor& position);

// LeanKV's decode step (leankv_ops.h's leankv_settle_plan / leankv_settle_apply shapes,
// contiguous): actions [m, 3] and amounts [m, 2] int32 are the plan's outputs; the candidates'
// key, value, acc and position may be undefined for the plan.
LeanKvSettleParams leankv_settle_params(at::Tensor& pool, const kv::leankv::PageFormat& format,
                                        const at::Tensor& tables, at::Tensor& token_counts,
                                        const at::Tensor& entries, const at::Tensor& lengths,
                                        const at::Tensor& candidate,
                                        const kv::leankv::Thresholds& thresholds,
                                        at::Tensor& actions, at::Tensor& amounts,
                                        const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& acc, const at::Tensor& position);

// blocks: [n, 2, num_kv_heads, block_size, head_dim] contiguous; bytes: [n, block_bytes] uint8
// contiguous; `format` an integer K and V format (kv::validate'd).
KvBlocksParams kv_blocks_params(at::Tensor& blocks, at::Tensor& bytes, const kv::KvFormat& format);

// FreeKV (freekv_ops.h's shapes, contiguous). scores [n_kv, n_page] float32, selected [n_kv, k]
// int64; the workspaces are left empty.
FreeKvSelectParams freekv_select_params(at::Tensor& scores, at::Tensor& selected,
                                        const at::Tensor& q, const at::Tensor& kmin,
                                        const at::Tensor& kmax, double scale);
FreeKvOffloadParams freekv_offload_params(const at::Tensor& rows_k, const at::Tensor& rows_v,
                                          at::Tensor& page, at::Tensor& kmin, at::Tensor& kmax);
// items int32 [n, 3].
FreeKvRecallParams freekv_recall_params(const at::Tensor& chunks, const at::Tensor& items,
                                        at::Tensor& cache_k, at::Tensor& cache_v,
                                        const at::Tensor& from_k, const at::Tensor& from_v);
// out [n_q, d] contiguous, q's dtype; slots int64 [n_kv] on the tensors' device.
FreeKvAttentionParams freekv_attention_params(at::Tensor& out, const at::Tensor& q,
                                              const at::Tensor& resident_k,
                                              const at::Tensor& resident_v,
                                              const at::Tensor& cache_k, const at::Tensor& cache_v,
                                              const at::Tensor& slots, double scale);

// Krul's decode-row statistics (torch_ops.h's krul_accumulate_rows shapes, contiguous).
KrulRowsParams krul_rows_params(const at::Tensor& rows, const at::Tensor& lengths,
                                at::Tensor& squared, at::Tensor& edge_mass);

}  // namespace strata::kernels
