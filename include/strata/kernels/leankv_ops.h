// LeanKV's operations in libtorch (docs/leankv.md): the CPU path of LeanKV deployments and the
// reference its CUDA kernels are tested against. Pages are kv/leankv_page_format.h's unified
// pages; the pool is uint8 [num_pages, page_bytes]; tables and counts are the page manager's
// (kv/leankv_pages.h). Any device; the index tensors on the pool's device.
#pragma once

#include <cstdint>
#include <tuple>
#include <utility>

#include "strata/kv/leankv_decision.h"
#include "strata/kv/leankv_page_format.h"

namespace at {
class Tensor;
}

namespace strata::kernels::aten {

// Prompt significance: for a prompt of n tokens, q [n, num_heads, d] and k [n, num_kv_heads, d]
// (after RoPE), A_g = causal softmax(q_g k^T * scale) per query head g. Returns float32
// [num_kv_heads, n]: acc[h, p] = max over the query heads g of KV head h of sum_{j > p} A_g[j, p]
// (the last token's is 0). Computed in chunks of query rows, never the whole n x n at once.
at::Tensor leankv_prompt_scores(const at::Tensor& q, const at::Tensor& k, double scale);

// Quantize-on-append: writes n tokens of one precision into the pool. page, slot: [n] int64
// (the page and the token's slot in it, slot < tokens_per_page; no two tokens share one);
// key, value: [n, d] any float dtype; acc: [n] float32; position: [n] int32.
void leankv_write_tokens(at::Tensor& pool, const kv::leankv::PageFormat& format,
                         kv::leankv::Precision precision, const at::Tensor& page,
                         const at::Tensor& slot, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& acc, const at::Tensor& position);

// Dequantize-on-read of n tokens at (page, slot): (key, value) float32 [n, d] (scale * q + zero),
// acc float32 [n], position int32 [n].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> leankv_read_tokens(
    const at::Tensor& pool, const kv::leankv::PageFormat& format, kv::leankv::Precision precision,
    const at::Tensor& page, const at::Tensor& slot);

// Where entries' stored tokens are: an entry's high tokens fill its high pages in order (token i
// at table[e, i / T_high], slot i % T_high), its low tokens its low pages (token j at
// table[e, W - 1 - j / T_low], slot j % T_low). tables [num_entries, W] int32; token_counts
// [num_entries, 2] int32 (high, low tokens); entries [n] integer. Returns int64 (page [m],
// slot [m]) of the tokens of that precision of every entry given, entry after entry, each in
// token order.
std::pair<at::Tensor, at::Tensor> leankv_token_slots(const kv::leankv::PageFormat& format,
                                                     kv::leankv::Precision precision,
                                                     const at::Tensor& tables,
                                                     const at::Tensor& token_counts,
                                                     const at::Tensor& entries);

// Decode attention over LeanKV pages and a full-precision window, one query token per sequence
// (the contract of the fused CUDA kernel):
//   q            [num_seqs, num_heads, d]
//   pool, tables, token_counts  as above
//   entries      [num_seqs, num_kv_heads] int32: the entry of each sequence's KV head (this layer)
//   window       [num_seqs, 2 (K, V), num_kv_heads, window_capacity, d], q's dtype: the recent
//                tokens in full precision, the new token's included, in any order
//   window_lens  [num_seqs] int32 (<= window_capacity), window_acc [num_seqs, num_kv_heads,
//                window_capacity] float32
// Query head g attends over its KV head's stored tokens (high pages, then low, dequantized) and
// its window: out[s, g] = softmax(q k^T * scale) v, in float32, returned in q's dtype. Each
// token's accumulator (in its page's scores segment, or window_acc) grows by the max over the KV
// head's query heads of the probability it received.
at::Tensor leankv_decode_attention(const at::Tensor& q, at::Tensor& pool,
                                   const kv::leankv::PageFormat& format, const at::Tensor& tables,
                                   const at::Tensor& token_counts, const at::Tensor& entries,
                                   const at::Tensor& window, const at::Tensor& window_lens,
                                   at::Tensor& window_acc, double scale);

// LeanKV's decode step for one layer (Algorithm 1, kv/leankv_decision.h): m entries, each the
// (sequence, KV head) of a sequence whose window a token leaves, in two halves around the page
// manager's allocation (kv::leankv::allocate_pages with `entries` and the plan's amounts).
//   entries    [m] int32, distinct; lengths [m] int64: each sequence's tokens, the new one
//              included; candidate [m] float32: the leaving token's score (accumulator / window)
// leankv_settle_plan reads each entry's stored tokens' accumulators and positions (score =
// acc / (length - 1 - position), float32) and returns
//   actions    [m, 3] int32: candidate's tier, victim's index in the candidate's tier or -1, the
//              victim's tier (kv::leankv::Tier values; DecodeAction)
//   amounts    [m, 2] int32: pages the entry's growing section needs (high, low): one when the
//              section that takes a token (the candidate's without a victim, the low one for a
//              demoted victim) has filled its last page, else none.
std::pair<at::Tensor, at::Tensor> leankv_settle_plan(
    const at::Tensor& pool, const kv::leankv::PageFormat& format, const at::Tensor& tables,
    const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
    const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds);

// leankv_settle_plan's decisions from the scores it reads: counts [m, 2] int64 (each entry's
// high and low tokens), scores[p] float32 (tier p's tokens' scores, entry after entry in
// leankv_token_slots' order), lengths [m] int64 and candidate [m] float32, all on the host.
// Returns actions and amounts as leankv_settle_plan does, on the host.
std::pair<at::Tensor, at::Tensor> leankv_settle_actions(const kv::leankv::PageFormat& format,
                                                        const at::Tensor& counts,
                                                        const at::Tensor (&scores)[2],
                                                        const at::Tensor& lengths,
                                                        const at::Tensor& candidate,
                                                        const kv::leankv::Thresholds& thresholds);

// leankv_settle_apply carries the actions out once the pages are there: a demoted victim is
// dequantized from its high cell and requantized at the end of the low section; the candidate
// (key, value [m, d] any float dtype; acc [m] float32; position [m] int32) is quantized into its
// victim's cell, or at the end of its tier's section without one; a pruned candidate is dropped.
// token_counts grow with the appended tokens.
void leankv_settle_apply(at::Tensor& pool, const kv::leankv::PageFormat& format,
                         const at::Tensor& tables, at::Tensor& token_counts,
                         const at::Tensor& entries, const at::Tensor& actions,
                         const at::Tensor& key, const at::Tensor& value, const at::Tensor& acc,
                         const at::Tensor& position);

}  // namespace strata::kernels::aten
