// Krul's restoration in the executor (torch_executor.h: partial_layers): which rows each layer
// computes when a chunk restores its history, and that layer's attention over them.

#include <ATen/ATen.h>

#include <algorithm>

#include "torch_executor.h"

namespace strata::executor {

std::vector<TorchExecutor::PartialLayer> TorchExecutor::partial_layers(
    const ForwardBatch& batch, const at::Tensor& tables, const at::Tensor& slots,
    const RotaryTables& rope) const {
  const bool restores = std::any_of(batch.chunks.begin(), batch.chunks.end(),
                                    [](const SequenceChunk& c) { return c.restored_tokens > 0; });
  if (!restores) return {};
  const int64_t num_layers = config_.num_layers;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  std::vector<PartialLayer> layers(num_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    // Query runs: (first row, rows, sequence index, sequence length at the run's end).
    struct Run {
      int64_t first, count, seq, seq_len;
    };
    std::vector<Run> runs;
    std::vector<int64_t> chunk_rows;
    bool all_rows = true;
    int64_t row = 0, layer_row = 0;
    for (int64_t s = 0; s < std::ssize(batch.chunks); ++s) {
      const SequenceChunk& c = batch.chunks[s];
      const int64_t n = std::ssize(c.tokens), start = c.start_position;
      const int64_t history = c.restored_tokens;
      const int64_t computed = history > 0 ? c.computed_rows[l] : history;
      chunk_rows.push_back(layer_row);
      if (computed < history) {
        all_rows = false;
        if (computed > 0) runs.push_back({row, computed, s, start + computed});
        runs.push_back({row + history, n - history, s, start + n});
        layer_row += computed + n - history;
      } else {
        runs.push_back({row, n, s, start + n});
        layer_row += n;
      }
      row += n;
    }
    if (all_rows) continue;  // rows stays undefined: the layer computes the whole batch
    std::vector<int64_t> rows, run_seqs;
    std::vector<int32_t> seq_lens, cu_q_lens = {0};
    PartialLayer& p = layers[l];
    p.chunk_rows = std::move(chunk_rows);
    for (const Run& r : runs) {
      for (int64_t i = 0; i < r.count; ++i) rows.push_back(r.first + i);
      run_seqs.push_back(r.seq);
      seq_lens.push_back(static_cast<int32_t>(r.seq_len));
      cu_q_lens.push_back(cu_q_lens.back() + static_cast<int32_t>(r.count));
      p.max_q_len = std::max(p.max_q_len, r.count);
    }
    const at::Tensor host_rows = at::tensor(rows, long_opts);
    p.rows = host_rows.to(device_);
    p.slots = slots[l].index_select(0, host_rows).to(device_);
    p.tables = tables[l].index_select(0, at::tensor(run_seqs, long_opts)).to(device_);
    p.seq_lens = at::tensor(seq_lens, at::kInt).to(device_);
    p.cu_q_lens = at::tensor(cu_q_lens, at::kInt).to(device_);
    p.rope = {rope.cos.index_select(0, p.rows), rope.sin.index_select(0, p.rows)};
  }
  return layers;
}

}  // namespace strata::executor
