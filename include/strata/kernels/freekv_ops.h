// FreeKV's operations in libtorch (docs/freekv.md): page summaries, group-consistent page
// selection, the query-similarity test of its correction, and decode attention over a
// sequence's resident tokens plus the pages recalled for each KV head. The CPU path and the
// reference of the CUDA kernels (kernels/freekv/, launchers in ops.h). Any device.
//
// Shapes: one decode token of one sequence and one layer; n_q query heads read KV head
// h / (n_q / n_kv); q is after RoPE. A page holds p tokens.
#pragma once

#include <cstdint>
#include <utility>

namespace at {
class Tensor;
}

namespace strata::kernels::aten {

// Min-max pooled keys of host pages: keys [n_page, n_kv, p, d] -> (kmin, kmax), each
// [n_page, n_kv, d] in the keys' dtype (the minimum and maximum of each channel over the page).
std::pair<at::Tensor, at::Tensor> freekv_summaries(const at::Tensor& keys);

// Group-consistent page scores: per query head h and page j the Quest bound s[h, j] = scale *
// sum_c max(q[h, c] kmax[j, c], q[h, c] kmin[j, c]) over its KV head's summaries, a softmax over
// pages, the mean over the query heads of each KV head. q [n_q, d]; kmin, kmax [n_page, n_kv, d].
// Returns float32 [n_kv, n_page].
at::Tensor freekv_page_scores(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                              double scale);

// Selection of `top_k` pages per KV head (all of them when there are fewer) by
// freekv_page_scores. Returns int64 [n_kv, min(top_k, n_page)], each row ascending (ties go to
// the lower page).
at::Tensor freekv_select(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                         int64_t top_k, double scale);

// The page layout conversions (ops.h, FreeKvOffloadParams / FreeKvRecallParams):
// offload: rows_k, rows_v [p, n_kv, d] -> page [n_kv, 2, p, d], kmin, kmax [n_kv, d] (written in
// place); recall: for each row {m, slot, source} of items int32 [n, 3], cache_k/v[slot, :, m, :]
// ([capacity, p, n_kv, d]) <- chunks[source] ([n_chunks, 2, p, d]) when source >= 0, else
// <- from_k/v[-source - 1, :, m, :].
void freekv_offload(const at::Tensor& rows_k, const at::Tensor& rows_v, at::Tensor& page,
                    at::Tensor& kmin, at::Tensor& kmax);
// The shape checks of freekv_offload and freekv_recall (c10::Error naming the shapes), which the
// torch_ops adapters also make before a kernel runs.
void check_freekv_offload(const at::Tensor& rows_k, const at::Tensor& rows_v,
                          const at::Tensor& page, const at::Tensor& kmin, const at::Tensor& kmax);
void check_freekv_recall(const at::Tensor& chunks, const at::Tensor& items,
                         const at::Tensor& cache_k, const at::Tensor& cache_v,
                         const at::Tensor& from_k, const at::Tensor& from_v);
void freekv_recall(const at::Tensor& chunks, const at::Tensor& items, at::Tensor& cache_k,
                   at::Tensor& cache_v, const at::Tensor& from_k, const at::Tensor& from_v);

// FreeKV's correction test: the cosine of each query head to the previous step's, averaged over
// the query heads of each KV head. q, q_prev [n_q, d] -> float32 [n_kv].
at::Tensor freekv_query_similarity(const at::Tensor& q, const at::Tensor& q_prev,
                                   int64_t num_kv_heads);

// Decode attention of q [n_q, d] over, per KV head m, the resident tokens resident_k/v
// [t, n_kv, d] (sink and window, every head) and the first slots[m] cache pages of cache_k/v
// [capacity, p, n_kv, d] (token-major: slot i of head m holds the page recalled for m into
// slot i; slots int64 [n_kv], on the host). What lies beyond a head's slots is never read, NaN
// included. Returns [n_q, d] in q's dtype; softmax in float32.
at::Tensor freekv_attention(const at::Tensor& q, const at::Tensor& resident_k,
                            const at::Tensor& resident_v, const at::Tensor& cache_k,
                            const at::Tensor& cache_v, const at::Tensor& slots, double scale);

}  // namespace strata::kernels::aten
