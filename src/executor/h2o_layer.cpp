#include "h2o_layer.h"

#include <ATen/ATen.h>

#include <limits>

#include "strata/common/check.h"

namespace strata::executor {

H2oLayer::H2oLayer(int64_t budget, int64_t window, int64_t num_kv_heads, int64_t head_dim,
                   at::ScalarType dtype, at::Device device)
    : budget_(budget), window_(window), num_kv_heads_(num_kv_heads) {
  STRATA_CHECK(budget > window && window >= 1) << "H2O: budget " << budget << ", window " << window;
  const auto options = at::TensorOptions().device(device);
  k_ = at::zeros({num_kv_heads, budget + 1, head_dim}, options.dtype(dtype));
  v_ = at::zeros_like(k_);
  scores_ = at::zeros({num_kv_heads, budget + 1}, options.dtype(at::kFloat));
  positions_ = at::zeros({num_kv_heads, budget + 1}, options.dtype(at::kLong));
}

void H2oLayer::prefill(const at::Tensor& k, const at::Tensor& v, const at::Tensor& received) {
  const int64_t n = k.size(0);
  const auto device = k_.device();
  // [n_kv, n, d]
  const at::Tensor keys = k.to(device, k_.scalar_type()).permute({1, 0, 2});
  const at::Tensor values = v.to(device, v_.scalar_type()).permute({1, 0, 2});
  at::Tensor scores = received.to(device, at::kFloat);
  at::Tensor kept;  // int64 [n_kv, kept]: the positions kept, per head
  if (n <= budget_) {
    kept = at::arange(n, scores.options().dtype(at::kLong)).expand({num_kv_heads_, n});
  } else {
    const int64_t older = n - window_;
    const at::Tensor heavy = std::get<1>(scores.narrow(1, 0, older).topk(budget_ - window_, 1));
    const at::Tensor recent =
        at::arange(older, n, heavy.options()).expand({num_kv_heads_, window_});
    kept = at::cat({heavy, recent}, 1);
  }
  kept_ = kept.size(1);
  const at::Tensor rows = kept.unsqueeze(2).expand({num_kv_heads_, kept_, keys.size(2)});
  k_.narrow(1, 0, kept_).copy_(keys.gather(1, rows));
  v_.narrow(1, 0, kept_).copy_(values.gather(1, rows));
  scores_.narrow(1, 0, kept_).copy_(scores.gather(1, kept));
  positions_.narrow(1, 0, kept_).copy_(kept);
  tokens_ = n;
}

at::Tensor H2oLayer::decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale) {
  const int64_t group = q.size(0) / num_kv_heads_, d = q.size(1);
  k_.select(1, kept_).copy_(k);
  v_.select(1, kept_).copy_(v);
  scores_.select(1, kept_).zero_();
  positions_.select(1, kept_).fill_(tokens_);
  ++kept_;
  ++tokens_;
  ++steps_;
  const at::Tensor keys = k_.narrow(1, 0, kept_).to(at::kFloat);  // [n_kv, kept, d]
  const at::Tensor values = v_.narrow(1, 0, kept_).to(at::kFloat);
  const at::Tensor qh = q.to(at::kFloat).view({num_kv_heads_, group, d});
  const at::Tensor probs = at::softmax(at::bmm(qh, keys.transpose(1, 2)).mul(scale), -1);
  const at::Tensor out =
      at::bmm(probs, values).view({num_kv_heads_ * group, d}).to(q.scalar_type());
  // The attention each kept token received, its own query's excluded (as the prompt's scores).
  at::Tensor received = probs.sum(1);  // [n_kv, kept]
  received.select(1, kept_ - 1).zero_();
  scores_.narrow(1, 0, kept_).add_(received);
  if (kept_ > budget_) evict();
  return out;
}

void H2oLayer::evict() {
  // The window's tokens (the newest `window_`) are never candidates.
  const at::Tensor candidates =
      scores_.narrow(1, 0, kept_)
          .masked_fill(positions_.narrow(1, 0, kept_) >= tokens_ - window_,
                       std::numeric_limits<float>::infinity());
  const at::Tensor victim = candidates.argmin(1, /*keepdim=*/true);  // [n_kv, 1]
  // The last slot's token moves into each head's victim slot.
  const int64_t last = kept_ - 1;
  const at::Tensor rows = victim.unsqueeze(2).expand({num_kv_heads_, 1, k_.size(2)});
  k_.scatter_(1, rows, k_.narrow(1, last, 1).clone());
  v_.scatter_(1, rows, v_.narrow(1, last, 1).clone());
  scores_.scatter_(1, victim, scores_.narrow(1, last, 1).clone());
  positions_.scatter_(1, victim, positions_.narrow(1, last, 1).clone());
  --kept_;
}

FreeKvCounts H2oLayer::stats() const {
  FreeKvCounts counts;
  counts.steps = steps_;
  counts.head_steps = steps_ * num_kv_heads_;
  return counts;
}

}  // namespace strata::executor
