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

int64_t FreeKvRuntime::sequence_bytes() const {
  const int64_t p = config_.page_tokens;
  const int64_t context = (max_context_tokens_ + p - 1) / p * p;
  const int64_t resident = config_.sink_tokens + config_.window_tokens + p;
  const int64_t recall = 2 * (config_.budget_tokens - config_.sink_tokens - config_.window_tokens);
  const int64_t token_bytes =
      2 * num_kv_heads_ * head_dim_ * static_cast<int64_t>(c10::elementSize(dtype_));
  return num_layers_ * (context + resident + recall) * token_bytes;
}

bool FreeKvRuntime::start(SeqId seq, int64_t n,
                          const std::function<std::pair<at::Tensor, at::Tensor>(int64_t)>& kv_of) {
  drop(seq);  // starting over
  if ((std::ssize(sequences_) + 1) * sequence_bytes() > config_.host_bytes) {
    if (refused_seqs_.insert(seq).second) ++refused_;
    return false;
  }
  refused_seqs_.erase(seq);
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
  return true;
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

void FreeKvRuntime::end(SeqId seq) {
  refused_seqs_.erase(seq);
  drop(seq);
}

void FreeKvRuntime::drop(SeqId seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  for (size_t l = 1; l < it->second.size(); ++l) add_counts(ended_, it->second[l]->stats());
  sequences_.erase(it);
}

FreeKvCounts FreeKvRuntime::counts() const {
  FreeKvCounts total = ended_;
  total.sequences = std::ssize(sequences_);
  total.refused_sequences = refused_;
  for (const auto& [seq, layers] : sequences_) {
    for (size_t l = 1; l < layers.size(); ++l) add_counts(total, layers[l]->stats());
  }
  return total;
}

}  // namespace strata::executor
