// Krul's attention statistics in the executor (docs/krul.md; private to the executor): for each
// sequence whose chunks ask for them (SequenceChunk::observe_attention), the per-layer I-R mass,
// the per-head squared distances between every pair of layers' attention rows and, built with
// num_kv_heads > 0 (ExecutorOptions::observe_token_mass), the attention each token received per
// layer and KV head (H2O's score) (kv::krul::AttentionStats), without ever holding [heads, s, s]
// of one layer, let alone all.
//
// The two paths of the paper, split by rows (squared distances add up over rows):
//   prompt rows   a chunk of n > 1 queries keeps copies of its sampled queries [rows, H, D] and
//                 of the keys [end, Hkv, D] it attends to, per layer; after the pass they are
//                 handed (in host memory) to a PromptReducer, whose thread turns them into
//                 attention rows of every layer and reduces them while the step thread goes on
//                 (prompt_reducer.h: the paper's CPU threads beside decoding).
//   decode rows   a chunk of one query turns into each layer's attention row [H, 1, t] as the
//                 layer runs (its keys are not kept; on the CPU the decode kernel hands the row
//                 over, computed with the layer's attention: observe_row); once the pass has run
//                 every layer, the rows of all layers are reduced together, then dropped. On the
//                 CPU into the float64 statistics (krul_accumulate); on CUDA (device_accumulators)
//                 into compensated float32 accumulators on the device
//                 (kernels::krul_accumulate_rows: Strata's kernel where the start-up self-check
//                 passed it), and the tokens' received attention into a float32 tensor there,
//                 folded into the statistics at take(), so a decode step's rows stay on the device.
// Only the rows at positions that are multiples of a chunk's stride are observed
// (SequenceChunk::observe_row_stride, kv_store.krul_row_stride: docs/krul.md decision 9): a
// prompt chunk keeps copies of those queries only, and a decode step at another position is not
// observed at all (observes_rows: the executor does not even gather its keys).
// take() adds the prompt rows' statistics (reducing here what the thread has not) and hands the
// statistics over.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "prompt_reducer.h"
#include "strata/common/ids.h"
#include "strata/kernels/kernel_selection.h"
#include "strata/kv/krul_policy.h"

namespace strata::executor {

class AttentionObserver {
 public:
  AttentionObserver(int32_t num_layers, int32_t num_heads, int32_t num_kv_heads,
                    bool device_accumulators = false);

  // Whether a chunk of n queries at positions [start, start + n) has rows to observe: those
  // whose position is a multiple of `stride` (kv_store.krul_row_stride).
  static bool observes_rows(int64_t start, int64_t n, int64_t stride) {
    return first_row(start, stride) < start + n;
  }
  // Layer `layer` of a chunk of `seq` that observes_rows: its queries q [n, H, D] at positions
  // [start, start + n) and the layer's keys of positions [0, start + n) (after RoPE), of which
  // the rows at multiples of `stride` are observed. A chunk at position 0 starts the sequence's
  // statistics over.
  void observe(SeqId seq, int64_t layer, const at::Tensor& q, at::Tensor keys, int64_t start,
               double scale, int64_t stride);
  // A decode step's row of layer `layer` as the attention computed it: probabilities [H, t] of
  // the query at position start = t - 1 (which observes_rows), instead of observe()'s query and
  // keys.
  void observe_row(SeqId seq, int64_t layer, const at::Tensor& probs, int64_t start);
  // After a pass: the decode rows it observed are reduced (on CUDA by `backend`), its prompt
  // chunks handed to the reducer's thread.
  void after_pass(kernels::KernelBackend backend);
  // The sequence's statistics with every observed row reduced (nullopt if none was observed);
  // the sequence is forgotten.
  std::optional<kv::krul::AttentionStats> take(SeqId seq);
  void forget(SeqId seq);
  // Prompt rows handed to the reducer and not reduced yet (tests).
  int64_t pending_prompt_rows() const { return reducer_ ? reducer_->pending_rows() : 0; }

 private:
  // The first position from `start` on that is a multiple of `stride`.
  static int64_t first_row(int64_t start, int64_t stride) {
    return (start + stride - 1) / stride * stride;
  }

  struct State;
  // The sequence's state for layer `layer` of a chunk at `start` (a chunk at position 0 starts
  // the sequence over).
  State& state_of(SeqId seq, int64_t layer, int64_t start);
  // Adds layer `layer`'s decode row [H, 1, t] (layers in order, from 0 each pass).
  static void add_decode_row(State& state, int64_t layer, at::Tensor row);

  struct State {
    uint64_t turn = 0;               // the reducer's key for this turn's prompt rows
    kv::krul::AttentionStats stats;  // of the decode rows
    // This pass's prompt chunk, if it observed one: its sampled queries and, per layer, the keys
    // [0, end) they attend to.
    PromptRows prompt;
    std::vector<at::Tensor> keys;
    // This pass's decode row [H, 1, t] of each layer observed so far.
    std::vector<at::Tensor> decode_rows;
    // CUDA: decode rows accumulated on the device (kernels::krul_accumulate_rows' squared
    // [1, L, L, H, 2] and edge_mass [1, L, 2]) since the last fold into `stats`, and how many.
    // The received attention [capacity, L, Hkv] (tokens [0, device_tokens) summed so far).
    at::Tensor device_squared, device_edge, device_mass;
    int64_t device_rows = 0, device_tokens = 0;
  };

  // Adds a decode step's rows [L, H, 1, t] to the device's token mass, grown to t tokens.
  void add_device_mass(State& state, const at::Tensor& rows) const;
  // Adds the device accumulators' totals to the statistics and clears them.
  void fold_device_rows(State& state) const;

  int32_t num_layers_;
  int32_t num_heads_;
  int32_t num_kv_heads_;
  bool device_accumulators_;
  std::unordered_map<SeqId, State> states_;
  uint64_t next_turn_ = 1;
  std::unique_ptr<PromptReducer> reducer_;  // started with the first prompt chunk observed
};

}  // namespace strata::executor
