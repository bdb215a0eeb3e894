#include "layers.h"

#include <ATen/ATen.h>

namespace strata::executor {

RotaryTables make_rotary_tables(const at::Tensor& positions, const at::Tensor& inv_freq,
                                at::ScalarType dtype) {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

}  // namespace strata::executor
