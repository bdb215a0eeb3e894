// H2O (Zhang et al., NeurIPS 2023, "Heavy-Hitter Oracle"), the static-eviction baseline of FreeKV
// deployments (freekv.method: h2o; docs/freekv.md), for one sequence and one layer (private to
// the executor). Per KV head the layer keeps at most `budget` tokens: the last `window` tokens
// and the heavy hitters, the older tokens that received the most attention so far (summed over
// every query since the prompt's and over the KV head's query heads). A decode step appends its
// token, attends the kept tokens, adds the attention each received, and when a head holds more
// than `budget` tokens evicts for good its lightest token outside the window. Evicted tokens are
// never read again: nothing is kept beyond the budget.
//
// State, on the layer's device (the keys after RoPE, so kept tokens need no re-rotation):
//   k, v       [n_kv, budget + 1, d] in the compute dtype; slots [0, kept) hold tokens in no order
//   scores     float32 [n_kv, budget + 1]: attention each kept token received
//   positions  int64 [n_kv, budget + 1]: each kept token's position (the window's test)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "strata/executor/executor.h"

namespace strata::executor {

class H2oLayer {
 public:
  // budget > window >= 1 (validate() checks the config).
  H2oLayer(int64_t budget, int64_t window, int64_t num_kv_heads, int64_t head_dim,
           at::ScalarType dtype, at::Device device);

  // The prompt's keys (after RoPE) and values [n, n_kv, d] (any device and dtype) and the
  // attention each token received from the tokens after it, float32 [n_kv, n] (summed over each
  // KV head's query heads): keeps the last `window` tokens and the budget - window others with
  // the most received attention.
  void prefill(const at::Tensor& k, const at::Tensor& v, const at::Tensor& received);
  // One decode token: appends k, v [n_kv, d] and returns the attention of q [n_q, d] (after
  // RoPE; n_q a multiple of n_kv) over the kept tokens, [n_q, d] in q's dtype.
  at::Tensor decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

  int64_t tokens() const { return tokens_; }  // the context so far, kept or evicted
  int64_t kept() const { return kept_; }      // tokens each KV head holds
  // Decode steps and head steps (the retrieval counts stay 0: H2O recalls nothing).
  FreeKvCounts stats() const;

 private:
  // Evicts each head's lightest token outside the window (the window holds the newest tokens).
  void evict();

  int64_t budget_, window_, num_kv_heads_;
  at::Tensor k_, v_, scores_, positions_;
  int64_t kept_ = 0, tokens_ = 0, steps_ = 0;
};

}  // namespace strata::executor
