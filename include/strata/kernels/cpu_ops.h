// Strata's CPU kernels for the per-token ops (kernels/torch_ops.h contracts): one host loop each
// instead of the 5-14 ATen operators of their libtorch implementations (aten_ops.h), and decode
// attention reading the pages in place instead of gathering each sequence's blocks into a copy
// (docs/quantized-weights.md, "Where a decode step goes"). They run for CPU tensors under
// KernelBackend::kStrata after the start-up self-check passes, like the CUDA kernels. Arguments are
// checked by torch_ops.cpp first; inputs may be strided in their outer dimensions, the innermost
// must be contiguous.
//
// Arithmetic follows the libtorch implementation's roundings: float32 accumulation, one rounding
// to the tensor dtype where ATen rounds (after each elementwise product for float16/bfloat16),
// so results agree with aten_ops.h within float rounding of the reduction order.
#pragma once

#include <utility>

namespace at {
class Tensor;
}
namespace strata::kv::leankv {
class PageFormat;
struct Thresholds;
}

namespace strata::kernels::cpu {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// Attention of a decode step: every sequence has at most one query (cu_q_lens steps by 0 or 1),
// at its last position, over the seq_lens[s] tokens its block table lists; writes its rows of
// out. Float32 scores, softmax and value sums; indices already checked (torch_ops.cpp). With
// `probs` (float32 [num_seqs, num_heads, >= max seq_lens], contiguous), also each query's
// post-softmax probabilities: probs[s, h, :seq_lens[s]] for every sequence with a query.
void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            const at::Tensor& cu_q_lens, double scale, at::Tensor* probs = nullptr);
// LeanKV's decode attention (kernels::aten::leankv_decode_attention's contract, leankv_ops.h):
// each (sequence, KV head) reads its stored tokens' quantized keys and values in place in their
// pages, then its window, float32 throughout; the accumulators grow as there. q and window
// float32, float16 or bfloat16; every tensor contiguous; indices not checked (the page
// manager's).
at::Tensor leankv_decode_attention(const at::Tensor& q, at::Tensor& pool,
                                   const kv::leankv::PageFormat& format, const at::Tensor& tables,
                                   const at::Tensor& token_counts, const at::Tensor& entries,
                                   const at::Tensor& window, const at::Tensor& window_lens,
                                   at::Tensor& window_acc, double scale);
// LeanKV's decode-step plan (kernels::aten::leankv_settle_plan's contract): each stored token's
// score read in place in its page, then aten::leankv_settle_actions' decisions. CPU tensors,
// contiguous, of the contract's dtypes (lengths int64, candidate float32); indices not checked.
std::pair<at::Tensor, at::Tensor> leankv_settle_plan(
    const at::Tensor& pool, const kv::leankv::PageFormat& format, const at::Tensor& tables,
    const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
    const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds);
// Throws c10::Error when a slot lies outside the pool.
void reshape_and_cache(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& slot_mapping);
// FreeKV's recall (ops.h, FreeKvRecallParams): a memcpy per token row, no libtorch operator (it
// runs on FreeKV's recall thread). Contiguous tensors, items int32; indices not checked.
void freekv_recall(const at::Tensor& chunks, const at::Tensor& items, at::Tensor& cache_k,
                   at::Tensor& cache_v, const at::Tensor& from_k, const at::Tensor& from_v);

}  // namespace strata::kernels::cpu
