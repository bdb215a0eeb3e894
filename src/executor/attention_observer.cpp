#include "attention_observer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "strata/common/check.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/torch_ops.h"

namespace strata::executor {

AttentionObserver::AttentionObserver(int32_t num_layers, int32_t num_heads,
                                     bool device_accumulators)
    : num_layers_(num_layers), num_heads_(num_heads), device_accumulators_(device_accumulators) {}

void AttentionObserver::observe(SeqId seq, int64_t layer, const at::Tensor& q, at::Tensor keys,
                                int64_t start, double scale, int64_t stride) {
  STRATA_CHECK(observes_rows(start, q.size(0), stride)) << "no row of the chunk is observed";
  if (start == 0 && layer == 0) states_.erase(seq);
  auto [it, added] = states_.try_emplace(seq);
  State& state = it->second;
  if (added) state.stats = kv::krul::AttentionStats(num_layers_, num_heads_);
  const int64_t n = q.size(0);
  if (n == 1) {
    if (layer == 0) state.decode_rows.clear();
    STRATA_CHECK(std::ssize(state.decode_rows) == layer)
        << "decode attention of layer " << layer << " observed out of order";
    // The layer's row now, from the keys it is handed (which are not kept: copying every
    // layer's keys again for one batched product cost more than the products).
    state.decode_rows.push_back(kernels::aten::krul_attention_rows(q, keys, start, scale));
    return;
  }
  const int64_t first = first_row(start, stride);
  if (layer == 0) state.prompt.push_back({{}, start, start + n, first, stride, 0, scale});
  PromptChunk& chunk = state.prompt.back();
  STRATA_CHECK(chunk.start == start && std::ssize(chunk.q) == layer)
      << "attention of layer " << layer << " at " << start << " observed out of order";
  chunk.q.push_back(q.slice(0, first - start, n, stride).clone());
  if (std::ssize(state.keys) <= layer) state.keys.resize(static_cast<size_t>(layer) + 1);
  state.keys[static_cast<size_t>(layer)] = std::move(keys);
}

int64_t AttentionObserver::reduce_prompt(State& state, int64_t rows) {
  int64_t done = 0;
  while (done < rows && !state.prompt.empty()) {
    PromptChunk& chunk = state.prompt.front();
    const int64_t n = chunk.q.front().size(0);
    const int64_t take = std::min({kRowBlock, rows - done, n - chunk.reduced});
    const int64_t first = chunk.first + chunk.reduced * chunk.stride;
    std::vector<at::Tensor> layer_rows;
    layer_rows.reserve(chunk.q.size());
    for (size_t l = 0; l < chunk.q.size(); ++l) {
      // rows first, first + stride, ... over the chunk's keys, zero beyond each row's position
      layer_rows.push_back(kernels::aten::krul_attention_rows(
          chunk.q[l].narrow(0, chunk.reduced, take), state.keys[l].narrow(0, 0, chunk.end), first,
          chunk.scale, chunk.stride));
    }
    const at::Tensor lengths =
        at::arange(first + 1, first + 1 + take * chunk.stride, chunk.stride, at::kLong);
    kernels::aten::krul_accumulate(at::stack(layer_rows), lengths, state.stats);
    chunk.reduced += take;
    done += take;
    if (chunk.reduced == n) state.prompt.pop_front();
  }
  if (state.prompt.empty()) state.keys.clear();
  return done;
}

void AttentionObserver::after_pass(kernels::KernelBackend backend) {
  int64_t budget = kPromptRowsPerPass;
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
      } else {
        kernels::aten::krul_accumulate(rows, at::full({1}, t, at::kLong), state.stats);
      }
    }
    state.decode_rows.clear();
    if (budget > 0) budget -= reduce_prompt(state, budget);
  }
}

void AttentionObserver::fold_device_rows(State& state) const {
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
  State& state = it->second;
  while (!state.prompt.empty()) reduce_prompt(state, INT64_MAX);
  fold_device_rows(state);
  std::optional<kv::krul::AttentionStats> stats = std::move(state.stats);
  states_.erase(it);
  return stats;
}

}  // namespace strata::executor
