#include "freekv_runtime.h"

#include <ATen/ATen.h>

namespace strata::executor {

StatusOr<FreeKvRuntime> FreeKvRuntime::create(const FreeKvConfig& config, int64_t num_layers,
                                              int64_t num_kv_heads, int64_t head_dim,
                                              int64_t max_context_tokens, at::ScalarType dtype,
                                              const FreeKvDevice& device) {
  STRATA_RETURN_IF_ERROR(validate(config));
  return FreeKvRuntime(config, num_layers, num_kv_heads, head_dim, max_context_tokens, dtype,
                       device);
}

void FreeKvRuntime::start(SeqId seq, int64_t n,
                          const std::function<std::pair<at::Tensor, at::Tensor>(int64_t)>& kv_of) {
  end(seq);
  // The first layer attends every token: a window as long as the context never offloads.
  const int64_t p = config_.page_tokens;
  FreeKvConfig exact = config_;
  exact.sink_tokens = 0;
  exact.window_tokens = (max_context_tokens_ + p - 1) / p * p;
  exact.budget_tokens = exact.window_tokens + p;
  std::vector<std::unique_ptr<FreeKvLayer>> layers;
  for (int64_t l = 0; l < num_layers_; ++l) {
    layers.push_back(std::make_unique<FreeKvLayer>(l == 0 ? exact : config_, num_kv_heads_,
                                                   head_dim_, dtype_, *worker_, device_));
    auto [k, v] = kv_of(l);
    layers.back()->prefill(k.narrow(0, 0, n), v.narrow(0, 0, n));
  }
  sequences_.emplace(seq, std::move(layers));
}

at::Tensor FreeKvRuntime::attend(std::span<const SeqId> seqs, int64_t layer, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v, double scale) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    FreeKvLayer& state = *sequences_.at(seqs[i])[layer];
    out.push_back(state.decode(q[row], k[row], v[row], scale));
  }
  return at::stack(out);
}

void FreeKvRuntime::add(FreeKvCounts& to, const FreeKvCounts& from) {
  to.steps += from.steps;
  to.head_steps += from.head_steps;
  to.corrected_heads += from.corrected_heads;
  to.recalled_pages += from.recalled_pages;
  to.reused_pages += from.reused_pages;
  to.recall_seconds += from.recall_seconds;
  to.recall_exposed_seconds += from.recall_exposed_seconds;
}

void FreeKvRuntime::end(SeqId seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  for (size_t l = 1; l < it->second.size(); ++l) add(ended_, it->second[l]->stats());
  sequences_.erase(it);
}

FreeKvCounts FreeKvRuntime::counts() const {
  FreeKvCounts total = ended_;
  total.sequences = std::ssize(sequences_);
  for (const auto& [seq, layers] : sequences_) {
    for (size_t l = 1; l < layers.size(); ++l) add(total, layers[l]->stats());
  }
  return total;
}

}  // namespace strata::executor
