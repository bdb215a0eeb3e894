// FreeKV's per-sequence state in the executor (docs/freekv.md; private to the executor): a
// sequence is computed in the KV pool as usual until a pass ends with its context at
// min_context_tokens or more; then each layer's keys and values move into a FreeKvLayer
// (freekv_layer.h), the engine takes the sequence off the pool (ForwardResult::compressed, as
// LeanKV's), and from then on its decode steps attend through those layers: the first layer over
// every token (FreeKV never compresses it), the others by speculative retrieval, or under
// method h2o by H2O's static eviction (h2o_layer.h), whose heavy hitters need the attention each
// token received: an H2O runtime observes a sequence's chunks from position 0 while the pool
// computes them (observe()), and a sequence it has not observed stays on the pool.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "freekv_layer.h"
#include "h2o_layer.h"
#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/executor/executor.h"

namespace strata::executor {

class FreeKvRuntime {
 public:
  // INVALID_ARGUMENT for options validate() refuses. max_context_tokens bounds a sequence (the
  // first layer's exact window holds that many tokens); the layers run on `device`.
  static StatusOr<FreeKvRuntime> create(const FreeKvConfig& config, int64_t num_layers,
                                        int64_t num_kv_heads, int64_t head_dim,
                                        int64_t max_context_tokens, at::ScalarType dtype,
                                        const FreeKvDevice& device);

  bool decoding(SeqId seq) const { return sequences_.contains(seq); }
  // Whether a sequence of `context` tokens leaves the pool for FreeKV.
  bool wants(int64_t context) const { return context >= config_.min_context_tokens; }

  // H2O: whether the pool's chunk of `seq` at `start` is observed (the sequence is not decoding
  // from its layers, and this chunk starts it or it is observed already), and the observation:
  // a chunk's queries q [m, H, D] at positions [start, start + m) and the sequence's keys so far
  // [start + m, Hkv, D] (after RoPE). A chunk at position 0 starts the sequence over.
  bool observes(SeqId seq, int64_t start) const;
  void observe(SeqId seq, int64_t layer, const at::Tensor& q, const at::Tensor& keys, int64_t start,
               double scale);

  // The sequence's n tokens are computed: kv_of(layer) gives their keys (after RoPE) and values
  // [n, Hkv, D] each. It reserves sequence_bytes() of host_bytes first: false (nothing done,
  // counted refused) when they are taken, and the sequence stays on the pool. H2O: false as well
  // (not counted) for a sequence not observed from position 0.
  bool start(SeqId seq, int64_t n,
             const std::function<std::pair<at::Tensor, at::Tensor>(int64_t)>& kv_of);
  // What a sequence's layers take at most: a whole context in each (host pages, or the first
  // layer's window), plus each layer's resident tokens and two recall buffers, as keys and values.
  int64_t sequence_bytes() const;

  // Decode of layer `layer` for sequences that decode from FreeKV (one new token each): appends
  // k, v [m, Hkv, D] and returns attention [m, H, D] for q [m, H, D].
  at::Tensor attend(std::span<const SeqId> seqs, int64_t layer, const at::Tensor& q,
                    const at::Tensor& k, const at::Tensor& v, double scale);

  void end(SeqId seq);  // finished, aborted or restarted

  // Over the sequences decoding now and those ended (the retrieval layers, not the exact first).
  FreeKvCounts counts() const;

 private:
  FreeKvRuntime(const FreeKvConfig& config, int64_t num_layers, int64_t num_kv_heads,
                int64_t head_dim, int64_t max_context_tokens, at::ScalarType dtype,
                const FreeKvDevice& device)
      : config_(config),
        num_layers_(num_layers),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        max_context_tokens_(max_context_tokens),
        dtype_(dtype),
        device_(device),
        worker_(std::make_unique<RecallWorker>()) {}
  void drop(SeqId seq);  // its layers, their counts kept, and its observation
  // A sequence's layers: the first exact (a FreeKvLayer whose window holds the whole context),
  // then FreeKV's or H2O's.
  struct Layers {
    std::vector<std::unique_ptr<FreeKvLayer>> retrieval;  // every layer, or only the first (h2o)
    std::vector<std::unique_ptr<H2oLayer>> h2o;           // layers 1.. under h2o
    FreeKvCounts stats() const;                           // of the layers after the first
  };

  FreeKvConfig config_;
  int64_t num_layers_, num_kv_heads_, head_dim_, max_context_tokens_;
  at::ScalarType dtype_;
  FreeKvDevice device_;
  std::unique_ptr<RecallWorker> worker_;  // before the layers, which it outlives
  // Per sequence, its layers (unique_ptr: a layer's address is posted).
  std::unordered_map<SeqId, Layers> sequences_;
  // H2O: per sequence observed from position 0, per layer the attention each token received,
  // float32 [Hkv, tokens] (summed over each KV head's query heads).
  std::unordered_map<SeqId, std::vector<at::Tensor>> received_;
  FreeKvCounts ended_;
  // Sequences start() refused since they last ended (each counted once), and how many in all.
  std::unordered_set<SeqId> refused_seqs_;
  int64_t refused_ = 0;
};

}  // namespace strata::executor
