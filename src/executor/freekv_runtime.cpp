#include "freekv_runtime.h"

#include <ATen/ATen.h>

#include "strata/kernels/aten_ops.h"

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

bool FreeKvRuntime::observes(SeqId seq, int64_t start) const {
  return config_.method == FreeKvMethod::kH2o && !decoding(seq) &&
         (start == 0 || received_.contains(seq));
}

void FreeKvRuntime::observe(SeqId seq, int64_t layer, const at::Tensor& q, const at::Tensor& keys,
                            int64_t start, double scale) {
  if (start == 0 && layer == 0) received_[seq].assign(num_layers_, at::Tensor());
  auto found = received_.find(seq);
  if (found == received_.end() || layer == 0) return;  // the first layer stays exact: no scores
  const int64_t end = start + q.size(0), group = q.size(1) / num_kv_heads_;
  at::Tensor received = kernels::aten::attention_received(q, keys, start, scale)
                            .view({num_kv_heads_, group, end})
                            .sum(1);
  at::Tensor& sums = found->second[layer];
  if (sums.defined()) received.narrow(1, 0, sums.size(1)) += sums;
  sums = received;
}

bool FreeKvRuntime::start(SeqId seq, int64_t n,
                          const std::function<std::pair<at::Tensor, at::Tensor>(int64_t)>& kv_of) {
  const bool h2o = config_.method == FreeKvMethod::kH2o;
  if (h2o && !received_.contains(seq)) return false;  // its prompt was not observed
  std::vector<at::Tensor> received;
  if (h2o) received = std::move(received_.at(seq));
  drop(seq);  // starting over
  if ((std::ssize(sequences_) + 1) * sequence_bytes() > config_.host_bytes) {
    if (refused_seqs_.insert(seq).second) ++refused_;
    if (h2o) received_[seq] = std::move(received);  // observed on: it may start at a later pass
    return false;
  }
  refused_seqs_.erase(seq);
  // The first layer attends every token: a window as long as the context never offloads.
  const int64_t p = config_.page_tokens;
  FreeKvConfig exact = config_;
  exact.method = FreeKvMethod::kRetrieval;
  exact.sink_tokens = 0;
  exact.window_tokens = (max_context_tokens_ + p - 1) / p * p;
  exact.budget_tokens = exact.window_tokens + p;
  Layers layers;
  for (int64_t l = 0; l < num_layers_; ++l) {
    auto [k, v] = kv_of(l);
    if (l > 0 && h2o) {
      layers.h2o.push_back(std::make_unique<H2oLayer>(config_.budget_tokens, config_.window_tokens,
                                                      num_kv_heads_, head_dim_, dtype_,
                                                      device_.device));
      layers.h2o.back()->prefill(k.narrow(0, 0, n), v.narrow(0, 0, n), received[l].narrow(1, 0, n));
      continue;
    }
    layers.retrieval.push_back(std::make_unique<FreeKvLayer>(
        l == 0 ? exact : config_, num_kv_heads_, head_dim_, dtype_, *worker_, device_));
    layers.retrieval.back()->prefill(k.narrow(0, 0, n), v.narrow(0, 0, n));
  }
  sequences_.emplace(seq, std::move(layers));
  return true;
}

at::Tensor FreeKvRuntime::attend(std::span<const SeqId> seqs, int64_t layer, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v, double scale) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    Layers& layers = sequences_.at(seqs[i]);
    if (layer > 0 && !layers.h2o.empty()) {
      out.push_back(layers.h2o[layer - 1]->decode(q[row], k[row], v[row], scale));
    } else {
      out.push_back(layers.retrieval[layer]->decode(q[row], k[row], v[row], scale));
    }
  }
  return at::stack(out);
}

void FreeKvRuntime::end(SeqId seq) {
  refused_seqs_.erase(seq);
  drop(seq);
}

void FreeKvRuntime::drop(SeqId seq) {
  received_.erase(seq);
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  add_counts(ended_, it->second.stats());
  sequences_.erase(it);
}

FreeKvCounts FreeKvRuntime::Layers::stats() const {
  FreeKvCounts total;
  for (size_t l = 1; l < retrieval.size(); ++l) add_counts(total, retrieval[l]->stats());
  for (const auto& layer : h2o) add_counts(total, layer->stats());
  return total;
}

FreeKvCounts FreeKvRuntime::counts() const {
  FreeKvCounts total = ended_;
  total.sequences = std::ssize(sequences_);
  total.refused_sequences = refused_;
  for (const auto& [seq, layers] : sequences_) add_counts(total, layers.stats());
  return total;
}

}  // namespace strata::executor
