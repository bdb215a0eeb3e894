#include "attention_observer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "strata/common/check.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/torch_ops.h"

namespace strata::executor {

AttentionObserver::AttentionObserver(int32_t num_layers, int32_t num_heads, int32_t num_kv_heads,
                                     bool device_accumulators)
    : num_layers_(num_layers),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      device_accumulators_(device_accumulators) {}

AttentionObserver::State& AttentionObserver::state_of(SeqId seq, int64_t layer, int64_t start) {
  if (start == 0 && layer == 0) forget(seq);
  auto [it, added] = states_.try_emplace(seq);
  State& state = it->second;
  if (added) {
    state.turn = next_turn_++;
    state.stats = kv::krul::AttentionStats(num_layers_, num_heads_, num_kv_heads_);
  }
  return state;
}

void AttentionObserver::add_decode_row(State& state, int64_t layer, at::Tensor row) {
  if (layer == 0) state.decode_rows.clear();
  STRATA_CHECK(std::ssize(state.decode_rows) == layer)
      << "decode attention of layer " << layer << " observed out of order";
  state.decode_rows.push_back(std::move(row));
}

void AttentionObserver::observe_row(SeqId seq, int64_t layer, const at::Tensor& probs,
                                    int64_t start) {
  STRATA_CHECK(probs.dim() == 2 && probs.size(0) == num_heads_ && probs.size(1) == start + 1)
      << "a decode row must be [" << num_heads_ << ", " << start + 1 << "], got " << probs.sizes();
  add_decode_row(state_of(seq, layer, start), layer, probs.unsqueeze(1));
}

void AttentionObserver::observe(SeqId seq, int64_t layer, const at::Tensor& q, at::Tensor keys,
                                int64_t start, double scale, int64_t stride) {
  STRATA_CHECK(observes_rows(start, q.size(0), stride)) << "no row of the chunk is observed";
  State& state = state_of(seq, layer, start);
  const int64_t n = q.size(0);
  if (n == 1) {
    // The layer's row now, from the keys it is handed (which are not kept: copying every
    // layer's keys again for one batched product cost more than the products).
    add_decode_row(state, layer, kernels::aten::krul_attention_rows(q, keys, start, scale));
    return;
  }
  PromptRows& chunk = state.prompt;
  if (layer == 0) {
    chunk = {{}, first_row(start, stride), stride, start + n, scale};
    state.keys.clear();
  }
  STRATA_CHECK(chunk.end == start + n && std::ssize(chunk.q) == layer)
      << "attention of layer " << layer << " at " << start << " observed out of order";
  chunk.q.push_back(q.slice(0, chunk.first - start, n, stride).clone());
  state.keys.push_back(std::move(keys));
}

void AttentionObserver::after_pass(kernels::KernelBackend backend) {
  for (auto& [seq, state] : states_) {
    if (std::ssize(state.decode_rows) == num_layers_) {
      const at::Tensor rows = at::stack(state.decode_rows);  // [layers, heads, 1, t]
      const int64_t t = rows.size(3);
      if (device_accumulators_) {
        if (!state.device_squared.defined()) {
          const auto options = rows.options().dtype(at::kFloat);
          state.device_squared = at::zeros({1, num_layers_, num_layers_, num_heads_, 2}, options);
          state.device_edge = at::zeros({1, num_layers_, 2}, options);
        }
        kernels::krul_accumulate_rows(rows.view({1, num_layers_, num_heads_, t}),
                                      at::full({1}, t, rows.options().dtype(at::kLong)),
                                      state.device_squared, state.device_edge, backend);
        ++state.device_rows;
        if (num_kv_heads_ > 0) add_device_mass(state, rows);
      } else {
        kernels::aten::krul_accumulate(rows, at::full({1}, t, at::kLong), state.stats);
      }
    }
    state.decode_rows.clear();
    if (std::ssize(state.prompt.q) == num_layers_) {
      // The reducer's thread reads host memory (on CUDA: one copy per pass, after its compute).
      for (at::Tensor& q : state.prompt.q) q = q.cpu();
      for (at::Tensor& k : state.keys) k = k.cpu();
      if (!reducer_) {
        reducer_ = std::make_unique<PromptReducer>(num_layers_, num_heads_, num_kv_heads_);
      }
      reducer_->submit(state.turn, std::move(state.prompt), std::move(state.keys));
    }
    state.prompt = {};
    state.keys.clear();
  }
}

void AttentionObserver::add_device_mass(State& state, const at::Tensor& rows) const {
  const at::Tensor received = kernels::aten::krul_token_mass(rows, num_kv_heads_);  // [t, L, Hkv]
  const int64_t t = received.size(0);
  if (!state.device_mass.defined() || state.device_mass.size(0) < t) {
    at::Tensor grown =
        at::zeros({std::max<int64_t>(t, 2 * state.device_tokens), num_layers_, num_kv_heads_},
                  received.options());
    if (state.device_tokens > 0) {
      grown.narrow(0, 0, state.device_tokens)
          .copy_(state.device_mass.narrow(0, 0, state.device_tokens));
    }
    state.device_mass = grown;
  }
  state.device_mass.narrow(0, 0, t).add_(received);
  state.device_tokens = std::max(state.device_tokens, t);
}

void AttentionObserver::fold_device_rows(State& state) const {
  if (state.device_tokens > 0) {
    const at::Tensor mass = state.device_mass.narrow(0, 0, state.device_tokens).cpu().contiguous();
    state.stats.add_token_mass({mass.data_ptr<float>(), static_cast<size_t>(mass.numel())});
    state.device_mass.zero_();
    state.device_tokens = 0;
  }
  if (state.device_rows == 0) return;
  const auto total = [](const at::Tensor& acc) {
    return (acc.select(-1, 0).to(at::kDouble) - acc.select(-1, 1).to(at::kDouble)).cpu();
  };
  const at::Tensor squared = total(state.device_squared)[0];  // [L, L, H]
  const at::Tensor edge = total(state.device_edge)[0];        // [L]
  const double* s = squared.data_ptr<double>();
  const double* e = edge.data_ptr<double>();
  for (int32_t i = 0; i < num_layers_; ++i) {
    state.stats.edge_mass[static_cast<size_t>(i)] += e[i];
    state.stats.observed[static_cast<size_t>(i)] += num_heads_ * state.device_rows;
    for (int32_t j = 0; j < i; ++j) {
      for (int32_t h = 0; h < num_heads_; ++h) {
        state.stats.squared_at(i, j, h) += s[(i * num_layers_ + j) * num_heads_ + h];
      }
    }
  }
  state.device_squared.zero_();
  state.device_edge.zero_();
  state.device_rows = 0;
}

std::optional<kv::krul::AttentionStats> AttentionObserver::take(SeqId seq) {
  auto it = states_.find(seq);
  if (it == states_.end()) return std::nullopt;
  State state = std::move(it->second);
  states_.erase(it);  // forgotten even when a reduction below throws
  fold_device_rows(state);
  std::optional<kv::krul::AttentionStats> stats = std::move(state.stats);
  if (reducer_) stats->add(reducer_->take(state.turn));
  return stats;
}

void AttentionObserver::forget(SeqId seq) {
  auto it = states_.find(seq);
  if (it == states_.end()) return;
  if (reducer_) reducer_->drop(it->second.turn);
  states_.erase(it);
}

}  // namespace strata::executor
