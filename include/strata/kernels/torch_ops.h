// at::Tensor adapters over the launchers in ops.h: the only place kernels meet libtorch. Each
// checks device, dtype, shape and contiguity (throwing c10::Error with a clear message, as ATen
// ops do). CUDA tensors run Strata's kernel on the tensor's current stream unless `backend` is
// kTorch; CPU tensors, and CUDA with kTorch, run the libtorch implementation (aten_ops.h).
#pragma once

#include <cstdint>
#include <utility>

#include "strata/kernels/kernel_selection.h"
#include "strata/kv/kv_format.h"
#include "strata/kv/leankv_decision.h"
#include "strata/kv/leankv_page_format.h"

namespace at {
class Tensor;
}
namespace c10 {
enum class ScalarType : int8_t;
}

namespace strata::kernels {

// See launch_rms_norm. x: [num_rows, hidden] float32/float16/bfloat16; weight: [hidden], x's
// dtype and device (contiguous for Strata's kernel).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                    KernelBackend backend = KernelBackend::kStrata);

// See launch_rotary. x: [num_tokens, num_heads, head_dim]; cos, sin: [num_tokens, head_dim], x's
// dtype and device (contiguous for Strata's kernel).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        KernelBackend backend = KernelBackend::kStrata);

// Paged attention over the KV pool (see launch_paged_attention in ops.h for the exact contract,
// docs/kernels/paged-attention.md for the design). Returns out [num_tokens, num_heads, head_dim]
// (contiguous, q's dtype): for query i of sequence s, at absolute position
// seq_lens[s] - q_len_s + i, softmax(q k^T * scale) v over the keys [0, that position] of the
// sequence's blocks; query head h reads kv head h / (num_heads / num_kv_heads).
//   q            [num_tokens, num_heads, head_dim], packed in sequence order
//   kv_cache     [num_blocks, 2, num_kv_heads, block_size, head_dim], q's dtype and device;
//                dim 1: 0 = K (after RoPE), 1 = V; block_size a power of two
//   block_tables [num_seqs, max_blocks_per_seq] int32, this layer's table
//   seq_lens     [num_seqs] int32, context length including the new tokens
//   cu_q_lens    [num_seqs + 1] int32, prefix sums of the per-sequence query counts
//   max_q_len    >= every q_len (host-known; 1 for a pure decode batch)
// Devices: every tensor lives on q's device. On CUDA: float16/bfloat16, head_dim 64 or 128,
// last dims contiguous, 16-byte aligned strides (any token/head stride of q, e.g. a view of a
// fused QKV output); the index values are not validated (see the REQUIRES of
// launch_paged_attention); runs on the current stream, with a split-K workspace from the caching
// allocator; float32 on CUDA, and kTorch, run the ATen path (lengths read on the host: a sync).
// On CPU: float32/float16/bfloat16, any head_dim; index values are validated; per sequence
// gather + at::scaled_dot_product_attention (enable_gqa).
// Throws c10::Error on a bad shape, dtype, device or layout (and, on CPU, bad index values).
// probs (Krul's decode rows, docs/krul.md): when given and the call runs Strata's CPU decode
// kernel (CPU tensors, max_q_len 1), set to float32 [num_seqs, num_heads, max seq_lens] holding
// each query's post-softmax probabilities over its sequence's keys, probs[s, h, :seq_lens[s]]
// (the rest, and the rows of sequences without a query, unset); otherwise set undefined.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& cu_q_lens, int64_t max_q_len, double scale,
                           KernelBackend backend = KernelBackend::kStrata,
                           at::Tensor* probs = nullptr);

// Writes key/value [num_tokens, num_kv_heads, head_dim] into kv_cache (same dtype and device) at
// slot_mapping [num_tokens] int64 (slot = block_id * block_size + offset; slot < 0 skips the
// token). float32/float16/bfloat16 on CPU and CUDA; on CUDA the last dims must be contiguous
// (key/value may be strided views) and slots are not validated (REQUIRES: slot < num_blocks *
// block_size, no two tokens share a slot) by Strata's kernel; on CPU and with kTorch an
// out-of-pool slot throws.
void reshape_and_cache(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& slot_mapping,
                       KernelBackend backend = KernelBackend::kStrata);

// KV blocks [n, 2 (K, V), num_kv_heads, block_size, head_dim] of `dtype` from their bytes
// [n, kv::block_bytes(format, ...)] uint8 (kv_format_ops.h's unpack_kv_blocks, rounded to
// `dtype`): what the KV store's encoded chunks decode to on their way into the pool. On CUDA,
// integer formats run Strata's kernel (launch_unpack_kv_blocks) on the current stream; the rest,
// and kTorch, run libtorch. Throws c10::Error on a bad shape or an invalid format.
at::Tensor unpack_kv_blocks(const at::Tensor& bytes, const kv::KvFormat& format,
                            int64_t num_kv_heads, int64_t block_size, int64_t head_dim,
                            c10::ScalarType dtype, KernelBackend backend = KernelBackend::kStrata);

// The bytes [n, kv::block_bytes(format, ...)] uint8 of KV blocks [n, 2 (K, V), num_kv_heads,
// block_size, head_dim] (kv_format_ops.h's pack_kv_blocks, bit-identical): the KV store's chunks
// encoded by its lossy codec. On CUDA, integer formats over float32/float16/bfloat16 blocks run
// Strata's kernel (launch_pack_kv_blocks) on the current stream; the rest, and kTorch, run
// libtorch. Throws c10::Error on a bad shape or an invalid format.
at::Tensor pack_kv_blocks(const at::Tensor& blocks, const kv::KvFormat& format,
                          KernelBackend backend = KernelBackend::kStrata);

// Krul's decode-row statistics (ops.h's KrulRowsParams contract: rows float32 [num_seqs,
// num_layers, num_heads, stride], lengths int64 [num_seqs], the compensated accumulators squared
// [num_seqs, num_layers, num_layers, num_heads, 2] and edge_mass [num_seqs, num_layers, 2]
// float32 added to in place). On CUDA, contiguous tensors run Strata's kernel
// (launch_krul_accumulate_rows) on the current stream; the rest, and kTorch, run libtorch
// (krul_ops.h). Throws c10::Error on a bad shape.
void krul_accumulate_rows(const at::Tensor& rows, const at::Tensor& lengths, at::Tensor& squared,
                          at::Tensor& edge_mass, KernelBackend backend = KernelBackend::kStrata);

// FreeKV's operations (kernels::aten's freekv_* contracts, freekv_ops.h; launchers in ops.h).
// Every tensor on q's (or the rows', the chunks') device and dtype; items int32 and slots int64
// on that device. On CUDA Strata's kernels run on the current stream for float16/bfloat16,
// head_dim 64 or 128 and groups of at most 8 query heads (the copies for any float type with
// 16-byte rows), contiguous tensors; the rest, CPU tensors and kTorch run libtorch. Throws
// c10::Error on a bad shape, dtype or device.
at::Tensor freekv_select(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                         int64_t top_k, double scale,
                         KernelBackend backend = KernelBackend::kStrata);
void freekv_offload(const at::Tensor& rows_k, const at::Tensor& rows_v, at::Tensor& page,
                    at::Tensor& kmin, at::Tensor& kmax,
                    KernelBackend backend = KernelBackend::kStrata);
void freekv_recall(const at::Tensor& chunks, const at::Tensor& items, at::Tensor& cache_k,
                   at::Tensor& cache_v, const at::Tensor& from_k, const at::Tensor& from_v,
                   KernelBackend backend = KernelBackend::kStrata);
at::Tensor freekv_attention(const at::Tensor& q, const at::Tensor& resident_k,
                            const at::Tensor& resident_v, const at::Tensor& cache_k,
                            const at::Tensor& cache_v, const at::Tensor& slots, double scale,
                            KernelBackend backend = KernelBackend::kStrata);

// LeanKV (docs/leankv.md; kernels::aten's leankv_* contracts, leankv_ops.h; launchers in ops.h).
// Every tensor on the pool's device, contiguous. On CUDA Strata's kernels run on the current
// stream (the attention for float16/bfloat16 queries, head_dim 64 or 128 and groups of at most 8
// query heads; the rest for head_dim 64 or 128); CPU tensors and kTorch run libtorch. Throws
// c10::Error on a bad dtype or device.
//
// The page manager (kv/leankv_pages.h) over tensors: ring [P] int32, counters [3] int64, tables
// [E, W] int32, counts [E, 2] int32; entries [n] int32, amounts [n, 2] int32. CPU tensors run the
// sequential implementation; CUDA runs the kernels with no host round-trip (kTorch: the
// sequential one over host copies).
enum class LeanKvPageOp { kAllocate, kRelease, kSplit };
void leankv_pages(LeanKvPageOp op, at::Tensor& ring, at::Tensor& counters, at::Tensor& tables,
                  at::Tensor& counts, const at::Tensor& entries, const at::Tensor& amounts,
                  KernelBackend backend = KernelBackend::kStrata);
void leankv_write_tokens(at::Tensor& pool, const kv::leankv::PageFormat& format,
                         kv::leankv::Precision precision, const at::Tensor& page,
                         const at::Tensor& slot, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& acc, const at::Tensor& position,
                         KernelBackend backend = KernelBackend::kStrata);
// max_tokens: at least every (sequence, KV head)'s stored plus window tokens (the kernel's
// workspace; libtorch does not read it).
at::Tensor leankv_decode_attention(const at::Tensor& q, at::Tensor& pool,
                                   const kv::leankv::PageFormat& format, const at::Tensor& tables,
                                   const at::Tensor& token_counts, const at::Tensor& entries,
                                   const at::Tensor& window, const at::Tensor& window_lens,
                                   at::Tensor& window_acc, int64_t max_tokens, double scale,
                                   KernelBackend backend = KernelBackend::kStrata);
std::pair<at::Tensor, at::Tensor> leankv_settle_plan(
    const at::Tensor& pool, const kv::leankv::PageFormat& format, const at::Tensor& tables,
    const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
    const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds,
    KernelBackend backend = KernelBackend::kStrata);
void leankv_settle_apply(at::Tensor& pool, const kv::leankv::PageFormat& format,
                         const at::Tensor& tables, at::Tensor& token_counts,
                         const at::Tensor& entries, const at::Tensor& actions,
                         const at::Tensor& key, const at::Tensor& value, const at::Tensor& acc,
                         const at::Tensor& position,
                         KernelBackend backend = KernelBackend::kStrata);

}  // namespace strata::kernels
