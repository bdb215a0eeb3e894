// Krul's operations in libtorch (docs/krul.md): the attention statistics its selector reads and
// MiniCache's cross-layer merge of a layer pair's KV. The CPU path and the reference of the CUDA
// kernels. Any device.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include "strata/kv/krul_policy.h"

namespace at {
class Tensor;
}
namespace c10 {
enum class ScalarType : int8_t;  // ATen's element types (opaque here)
}

namespace strata::kernels::aten {

// Post-softmax attention of query rows at positions start, start + stride, ... over the keys
// before them (causal): q [r, num_heads, d] (after RoPE), k [end, num_kv_heads, d] with
// end > start + (r - 1) * stride (num_heads a multiple of num_kv_heads; query head g reads KV head
// g / (num_heads / num_kv_heads)). Returns float32 [num_heads, r, end], zero beyond each row's
// position.
at::Tensor krul_attention_rows(const at::Tensor& q, const at::Tensor& k, int64_t start,
                               double scale, int64_t stride = 1);

// Adds rows of every layer to the statistics: rows float32 [num_layers, num_heads, r, t] with row
// i's context length lengths[i] (int64 [r], <= t; zeros beyond it). Per layer, the probability on
// the first and the last max(1, floor(0.1 * length)) positions of each row (each position once)
// goes to edge_mass, and for every pair of layers and head the squared distance of their rows to
// squared (float32 Gram products of rows centred across layers, summed in float64:
// ||a - b||^2 = ||a||^2 + ||b||^2 - 2 a.b, clamped at 0). With stats.num_kv_heads > 0, also each
// of the t keys' received probability, summed over the rows and each KV head's query heads, to
// token_mass.
// H2O's score of rows float32 [num_layers, num_heads, r, t]: float32 [t, num_layers,
// num_kv_heads], each key's probability summed over the rows and its KV head's query heads, on
// the rows' device.
at::Tensor krul_token_mass(const at::Tensor& rows, int64_t num_kv_heads);
void krul_accumulate(const at::Tensor& rows, const at::Tensor& lengths,
                     kv::krul::AttentionStats& stats);

// ops.h's KrulRowsParams contract in libtorch (the reference of launch_krul_accumulate_rows):
// rows float32 [num_seqs, num_layers, num_heads, stride], lengths int64 [num_seqs] (any device);
// adds each sequence's squared distances between layers' rows (for i > j) to squared[..., 0]
// ([num_seqs, num_layers, num_layers, num_heads, 2] float32) and its edge mass to
// edge_mass[..., 0] ([num_seqs, num_layers, 2] float32), computed in float64; the compensation
// terms [..., 1] are left as they are.
void krul_accumulate_rows(const at::Tensor& rows, const at::Tensor& lengths, at::Tensor& squared,
                          at::Tensor& edge_mass);
// MiniCache's merge of one pair's keys or values, a (the shallow layer) and b (the deep one), both
// [n, num_kv_heads, d]: per (token, head) the magnitudes |a|, |b| and one direction, the SLERP of
// a/|a| and b/|b| at t (t = 0 gives a's, 1 b's). Pairs whose angle, as a share of pi, is in the
// top `retain` of the range over this tensor (> min + (1 - retain)(max - min)) keep both
// vectors instead, the widest `max_retained` of them when more qualify (< 0: all); retain = 0
// keeps none. With group > 0 the range and max_retained are taken per group of `group`
// consecutive tokens (n a multiple of it; the store's chunks), else over the whole tensor.
// Returns
//   direction  [n, num_kv_heads, d], a's dtype
//   magnitude  [2, n, num_kv_heads] float32 (a's, b's)
//   retained   [m] int64: token * num_kv_heads + head, ascending
//   originals  [2, m, d] a's dtype (a's, b's vectors of the retained pairs)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> krul_merge(const at::Tensor& a,
                                                                      const at::Tensor& b, double t,
                                                                      double retain,
                                                                      int64_t max_retained = -1,
                                                                      int64_t group = 0);

// Both layers back from a merge: a^ = |a| e, b^ = |b| e, retained pairs exact. Returns
// [2, n, num_kv_heads, d] in the direction's dtype.
at::Tensor krul_unmerge(const at::Tensor& direction, const at::Tensor& magnitude,
                        const at::Tensor& retained, const at::Tensor& originals);

// Krul's stored form of KV chunks (the store's layer-merge codec; docs/krul.md decision 8).
// chunks [n, layers, 2 (K, V), num_kv_heads, block, d] (the store's chunk layout) in any float
// dtype; `pairs`, form.pairs of them, disjoint with shallow < deep < layers. Each chunk becomes
// krul_merged_chunk_bytes bytes:
//   per layer, in order: nothing for a pair's shallow layer; [2, num_kv_heads, block, d] in the
//   chunks' dtype for the others, a pair's deep layer holding the pair's directions (krul_merge
//   at form.slerp_t over the chunk's block tokens) followed, for K then V, by its magnitudes
//   float32 [2 (shallow, deep), block, num_kv_heads], retained indices int32 [form.retained]
//   (token * num_kv_heads + head, ascending, -1 after the last) and their original vectors
//   [2, form.retained, d] in the dtype (zeros after the last).
// So the bytes from kv::krul::merged_layer_offset(layer) on restore every layer from `layer` on
// whatever the bytes before it hold (a stored suffix of the chunk).
// Returns uint8 [n, bytes] on the chunks' device.
int64_t krul_merged_chunk_bytes(const kv::krul::MergedForm& form, int64_t layers,
                                int64_t num_kv_heads, int64_t block, int64_t d,
                                int64_t element_bytes);
at::Tensor krul_merge_chunks(const at::Tensor& chunks, const kv::krul::MergedForm& form,
                             const std::vector<kv::krul::LayerPair>& pairs);
// The chunks back from their merged form (uint8 [n, bytes]): layers [layer_begin, layer_end)
// (layer_end < 0: to the last) of [n, layers, 2, num_kv_heads, block, d] in `dtype`, each pair's
// layers krul_unmerge'd, the others as stored: [n, layer_end - layer_begin, 2, num_kv_heads,
// block, d], read from only the bytes those layers are restored from (each one's place, a pair's
// shallow layer its deep layer's).
at::Tensor krul_unmerge_chunks(const at::Tensor& merged, const kv::krul::MergedForm& form,
                               const std::vector<kv::krul::LayerPair>& pairs, int64_t layers,
                               int64_t num_kv_heads, int64_t block, int64_t d,
                               c10::ScalarType dtype, int64_t layer_begin = 0,
                               int64_t layer_end = -1);

// H2O's stored form (Krul's H2O baseline, the store's h2o codecs; docs/krul.md decision 11):
// chunks [n, layers, 2 (K, V), num_kv_heads, block, d] (the store's chunk layout) in any dtype and
// mass float32 [tokens, layers, num_kv_heads], the attention each token received
// (kv::krul::AttentionStats::token_mass; a token past `tokens` counts 0, mass past n * block is
// ignored). Of the n * block tokens each (layer, KV head) keeps kept * block (kept <= n): the
// last floor(half) of them (the recent window) and the heavy hitters, the ones with the most
// received attention among the others (ties: either). Returns [kept, layers, 2, num_kv_heads,
// block, d]: the (layer, KV head)'s j-th kept token, in position order, at chunk j / block, slot
// j % block.
at::Tensor h2o_keep_chunks(const at::Tensor& chunks, const at::Tensor& mass, int64_t kept);

}  // namespace strata::kernels::aten
