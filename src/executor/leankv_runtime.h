// LeanKV's per-sequence state in the executor (docs/leankv.md; private to the executor): a
// sequence's prompt is computed in the KV pool as usual while the runtime sums the attention each
// key receives; when the prompt completes it is compressed (tiers by significance, pages from the
// page manager, the last `window` tokens kept in full precision); from then on the sequence
// decodes from its pages and window, and after each layer's attention the token leaving the window
// goes through Algorithm 1.
//
// State (on the executor's device; every step runs kernels::leankv_* ops: Strata's kernels on
// CUDA, libtorch and the sequential page manager on the CPU):
//   pages         uint8 [num_pages, page_bytes], kv/leankv_page_format.h
//   ring, counters, tables [num_entries, width], counts [num_entries, 2]: the page manager's
//   token_counts  int32 [num_entries, 2]: high and low tokens of each entry
//   window        [num_layers, max_sequences, 2, Hkv, window + 1, D], compute dtype: the position p
//                 of a sequence lives at slot p % (window + 1)
//   window_acc    float32 [num_layers, max_sequences, Hkv, window + 1]
// Entry of (sequence slot s, layer l, KV head h): (s * num_layers + l) * Hkv + h.
//
// In the decode step of Algorithm 1 the candidate takes its victim's slot (a demoted victim moves
// to the end of the low section), so sections never have holes and grow by at most one token.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/executor/executor.h"
#include "strata/kernels/kernel_selection.h"
#include "strata/kernels/torch_ops.h"
#include "strata/kv/leankv_page_format.h"
#include "strata/kv/leankv_pages.h"
#include "strata/kv/leankv_policy.h"
#include "strata/model/model_config.h"

namespace strata::executor {

class LeanKvRuntime {
 public:
  // RESOURCE_EXHAUSTED if the pool cannot be had; INVALID_ARGUMENT for bits or a head dim the page
  // format refuses.
  // State on `device`; the LeanKV kernels run on `backend` there (the self-check's choice).
  static StatusOr<LeanKvRuntime> create(const LeanKvConfig& config, const model::ModelConfig& model,
                                        at::ScalarType dtype, at::Device device,
                                        kernels::KernelBackend backend);

  // Whether the sequence's prompt was compressed (it decodes from LeanKV state), and whether its
  // prompt is being observed (computed from position 0 and not compressed yet).
  bool decoding(SeqId seq) const;
  bool observing(SeqId seq) const { return prompt_sums_.contains(seq); }

  // Prefill of layer `layer`: a chunk's queries q [m, H, D] at positions [start, start + m) and
  // the sequence's keys so far keys [start + m, Hkv, D] (after RoPE). Adds to each key the
  // attention the chunk's later queries give it. A chunk at position 0 starts the sequence over.
  void observe_prompt(SeqId seq, int64_t layer, const at::Tensor& q, const at::Tensor& keys,
                      int64_t start, double scale);

  // The prompt of n tokens is complete: kv_of(layer) gives its keys and values [n, Hkv, D] each.
  // RESOURCE_EXHAUSTED when the sequence slots run out or the page pool cannot hold it beside a
  // reserve for the next decode step of every decoding sequence (step_pages; a page per layer and
  // KV head for this one): nothing is kept, and counts().failed_prompts grows.
  Status compress(SeqId seq, int64_t n,
                  const std::function<std::pair<at::Tensor, at::Tensor>(int64_t)>& kv_of);

  // Decode of layer `layer` for sequences that decode (one new token each, at positions[i]):
  // appends k, v [m, Hkv, D] to their windows and returns attention [m, H, D] over their pages
  // and windows for q [m, H, D].
  at::Tensor attend(std::span<const SeqId> seqs, std::span<const int64_t> positions, int64_t layer,
                    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);
  // After attend() of the layer: the token leaving each window goes through Algorithm 1, per KV
  // head (kernels::leankv_settle_plan, the step's pages, leankv_settle_apply: Strata's kernels
  // where the self-check passed them, CUDA's or the CPU loop, else libtorch's). RESOURCE_EXHAUSTED
  // when the page pool runs out.
  Status settle(std::span<const SeqId> seqs, std::span<const int64_t> positions, int64_t layer);

  // Forgets a sequence (finished, aborted or restarted): its pages return to the ring.
  void end(SeqId seq);

  LeanKvCounts counts() const;
  // Pages the next decode step of a sequence may take: one per entry (layer, KV head) whose high
  // or low section fills its last page (a step grows one section of an entry by at most one
  // token); 0 for a sequence that does not decode.
  int64_t step_pages(SeqId seq) const;
  int64_t free_pages() const {
    return counter(kv::leankv::kRecycled) - counter(kv::leankv::kAllocated);
  }

 private:
  LeanKvRuntime() = default;
  // The page manager's operation on the given entries (amounts [n, 2] int32), on the device.
  void pages(kernels::LeanKvPageOp op, const std::vector<int32_t>& entries,
             const at::Tensor& amounts);
  int64_t counter(int index) const;  // counters_[index] (read on the host: a sync on CUDA)
  int32_t entry(int32_t slot, int64_t layer, int64_t head) const {
    return static_cast<int32_t>((slot * num_layers_ + layer) * num_kv_heads_ + head);
  }

  LeanKvConfig config_;
  kv::leankv::Thresholds thresholds_;
  kv::leankv::PageFormat format_;
  int64_t num_layers_ = 0, num_heads_ = 0, num_kv_heads_ = 0, head_dim_ = 0, width_ = 0;
  int64_t capacity_ = 0;  // window slots: window + 1
  at::ScalarType dtype_ = at::kFloat;
  kernels::KernelBackend backend_ = kernels::KernelBackend::kStrata;
  at::Tensor pages_, ring_, counters_, tables_, page_counts_, token_counts_;
  at::Tensor tokens_per_page_;  // int32 [2]: a high and a low page's tokens (step_pages)
  at::Tensor window_, window_acc_;
  std::unordered_map<SeqId, int32_t> slots_;  // sequences holding state
  std::vector<int32_t> free_slots_;
  std::unordered_map<SeqId, std::vector<at::Tensor>> prompt_sums_;  // per layer [H, length]
  std::unordered_map<SeqId, int64_t> pruned_;                       // tokens pruned per sequence
  std::unordered_map<SeqId, int64_t> lengths_;  // tokens of each decoding sequence
  LeanKvCounts ended_;                          // the since-start fields of counts()
};

}  // namespace strata::executor
