// Krul's decisions for one conversation (Krul §4 and §6, docs/krul.md): which layers may share
// one stored KV (the I-R detector), which pairs do (greedy disjoint pairing by attention
// distance), and how a resumed turn splits each layer's history between recomputation and
// loading (the pyramid plan). Pure functions over statistics the executor accumulates
// (kernels/krul_ops.h); no tensors here.
//
// Layers are 0-based; a pair names its shallow (earlier) and deep layer. Positions are token
// indices of the conversation's history, [0, tokens).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "strata/common/status.h"

namespace strata::kv::krul {

// Attention statistics of one conversation, summed over the query rows observed (prompt rows and
// decode rows alike; the two paths add up because squared distances are sums over rows).
//   edge_mass[l]        sum over rows and query heads of the probability layer l puts on the
//                       first and the last 10% of the row's context (at least one token each)
//   observed[l]         number of (row, query head) terms in edge_mass[l]
//   squared[(i*L+j)*H+h] for i > j: sum over rows of ||A_i[h, r, :] - A_j[h, r, :]||^2
//   token_mass          with num_kv_heads > 0, float [tokens, L, num_kv_heads]: the probability
//                       each token received, summed over the rows and the KV head's query heads
//                       (H2O's accumulated attention, the heavy-hitter score); tokens: the most
//                       keys a batch of observed rows was given (a later token received nothing)
struct AttentionStats {
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;  // 0: no token mass
  std::vector<double> edge_mass;
  std::vector<int64_t> observed;
  std::vector<double> squared;
  std::vector<float> token_mass;

  AttentionStats() = default;
  AttentionStats(int32_t layers, int32_t heads, int32_t kv_heads = 0);
  double& squared_at(int32_t deep, int32_t shallow, int32_t head) {
    return squared[(static_cast<size_t>(deep) * num_layers + shallow) * num_heads + head];
  }
  double squared_at(int32_t deep, int32_t shallow, int32_t head) const {
    return squared[(static_cast<size_t>(deep) * num_layers + shallow) * num_heads + head];
  }
  // The mean share of a row's probability on its first and last 10%, in [0, 1] (0 unobserved).
  double edge_share(int32_t layer) const;
  // D_ij of the paper: the mean over heads of the per-head Euclidean distance (order-free).
  double distance(int32_t a, int32_t b) const;
  int64_t tokens() const {
    return num_kv_heads > 0 ? std::ssize(token_mass) / (num_layers * num_kv_heads) : 0;
  }
  // Adds `mass` float [tokens, L, num_kv_heads] (of any number of tokens) to token_mass.
  void add_token_mass(std::span<const float> mass);
  // Adds another accumulation of the same shape (the prompt's and the decode rows').
  void add(const AttentionStats& other);
};

// The I-R (Initial-Recent) layers: edge_share >= gamma. Only they may be compressed; a layer
// with no observed row is not I-R.
std::vector<bool> initial_recent_layers(const AttentionStats& stats, double gamma);

struct LayerPair {
  int32_t shallow = 0;
  int32_t deep = 0;
  double distance = 0;
};

// Algorithm 1, lines 9-22: every pair of I-R layers (not only adjacent ones) in ascending
// distance (ties: the shallower pair first), taken when neither layer is used yet, until the
// used layers reach share * num_layers (share of ALL layers, as the algorithm's stopping test;
// an odd target overshoots by one layer) or the candidates run out. The result is a matching.
std::vector<LayerPair> select_pairs(const AttentionStats& stats, const std::vector<bool>& ir,
                                    double share);

// MiniCache's fixed strategy (the FKC baseline): adjacent pairs (l, l+1) from `first` up to
// `last` (inclusive), e.g. 16..31 for a 32-layer model.
std::vector<LayerPair> adjacent_pairs(int32_t first, int32_t last);

// INVALID_ARGUMENT unless the pairs are disjoint with shallow < deep < num_layers (a matching).
Status validate_pairs(const std::vector<LayerPair>& pairs, int32_t num_layers);

// The pairs select_pairs stops at for `share` of `num_layers`: the fewest whose layers reach
// share * num_layers, i.e. ceil(share * num_layers / 2), at most num_layers / 2.
int32_t pair_count(double share, int32_t num_layers);

// Krul's stored form of a conversation's KV chunks (the store's layer-merge codec,
// kernels::aten::krul_merge_chunks): every chunk merges the same `pairs` layer pairs (MiniCache's
// merge at slerp_t, retaining the vectors whose angle is in the top `retain` of the chunk's
// range, at most `retained` per pair and K or V).
struct MergedForm {
  int32_t pairs = 0;
  int32_t retained = 0;
  double slerp_t = 0.6;
  double retain = 0.05;
};

// The form a deployment stores: pair_count(share, num_layers) pairs, retaining at most
// ceil(retain x vectors_per_chunk) (a chunk's tokens x KV heads) per pair and K or V.
MergedForm merged_form(double share, double retain, int32_t num_layers, int64_t vectors_per_chunk);

// Where layer `layer`'s data begins in a chunk's merged form (docs/krul.md decision 8, laid out
// in layer order): each layer before it takes layer_bytes unless it is a pair's shallow layer
// (its data is its deep layer's), and a pair's deep layer also its pair's pair_bytes (magnitudes,
// retained indices and vectors of K and V). So the bytes from there to the end hold everything
// the layers from `layer` on are restored from: the stored suffix of a merged chunk.
int64_t merged_layer_offset(std::span<const LayerPair> pairs, int32_t layer, int64_t layer_bytes,
                            int64_t pair_bytes);

// What a resumed turn costs per layer, in seconds, measured on this machine (RestoreCosts come
// from a calibration run, docs/krul.md):
//   recompute of t tokens in one layer   t * compute_per_token + t^2 * attention_per_token2
//   load of t tokens of one layer        t * load_per_token
//   load of t tokens of a merged pair    t * merged_load_per_token (both layers' data)
// and, in the compute stream whatever the plan, `other_compute`: the pass's other rows (the new
// turn's tokens at every layer, which Strata computes in the restoring pass), beside which the
// loads run too.
struct RestoreCosts {
  double compute_per_token = 0;
  double attention_per_token2 = 0;
  double load_per_token = 0;
  double merged_load_per_token = 0;
  double other_compute = 0;
};

// A plan: layer l recomputes tokens [0, boundary[l]) and loads [boundary[l], tokens). Recompute
// of layer l needs layer l-1's hidden states of exactly those tokens, so boundaries never grow
// with depth (Eq. 4). A pair (shallow, deep) stores one merged suffix from the deep layer's
// boundary (the smaller) on; the shallow layer uses it beyond its own boundary.
struct RestorePlan {
  std::vector<int64_t> boundary;
  double compute_seconds = 0;
  double load_seconds = 0;
};

// INVALID_ARGUMENT unless boundaries are within [0, tokens], non-increasing with depth, one per
// layer, and pairs are disjoint with shallow < deep < num_layers.
Status validate_plan(const std::vector<int64_t>& boundary, int64_t tokens,
                     const std::vector<LayerPair>& pairs);

// The stream times of a plan under these costs.
void time_plan(RestorePlan& plan, int64_t tokens, const std::vector<LayerPair>& pairs,
               const RestoreCosts& costs);

// The bubble-free plan: non-increasing boundaries on multiples of `granularity` tokens (the
// last block may be partial) minimizing max(compute, load). Exact for the weighted sums
// compute + lambda * load (a dynamic program over layers and boundaries), with lambda searched
// for the crossing; the better of the two plans around it is returned. `floor` (empty, or one
// per layer): layer l recomputes at least floor[l] tokens (a stored suffix lacks the rest's KV);
// the plan is then the best of those that respect it.
RestorePlan plan_restore(int64_t tokens, int32_t num_layers, const std::vector<LayerPair>& pairs,
                         const RestoreCosts& costs, int64_t granularity,
                         std::span<const int64_t> floor = {});

// The fixed-ratio plan (the PRE baseline, and Krul without sharing): every layer recomputes the
// first round(ratio * tokens) tokens, on `granularity`.
RestorePlan fixed_ratio_plan(int64_t tokens, int32_t num_layers, double ratio, int64_t granularity);

// Bytes a plan stores, as a share of the full history's KV: unshared layers their suffix, a pair
// one suffix (times merged_load_per_token / load_per_token of the costs given) from its deep
// layer's boundary. The paper's model: (1 - r_c)(1 - P/N) at merged/plain = 1.
double stored_fraction(const RestorePlan& plan, int64_t tokens, const std::vector<LayerPair>& pairs,
                       const RestoreCosts& costs);

}  // namespace strata::kv::krul
