// ModelSource over a GGUF file (private to the model module).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/model/model_source.h"

namespace strata::model {

StatusOr<std::unique_ptr<ModelSource>> open_gguf_source(const std::string& path);

// Undoes the GGUF `llama` converter's Q/K row interleaving for one projection
// [num_heads * head_dim, row_len]: GGUF row h*D + 2j + t holds HF row h*D + t*D/2 + j.
// T: float for weights, uint8_t/float for 4-bit codes and their per-group maps.
template <typename T>
void unpermute_rope_rows(std::span<T> weight, int64_t num_heads, int64_t head_dim,
                         int64_t row_len) {
  std::vector<T> head(head_dim * row_len);
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    T* base = weight.data() + h * head_dim * row_len;
    std::copy(base, base + head_dim * row_len, head.begin());
    for (int64_t j = 0; j < half; ++j) {
      for (int64_t t = 0; t < 2; ++t) {
        std::copy_n(head.data() + (2 * j + t) * row_len, row_len, base + (t * half + j) * row_len);
      }
    }
  }
}

}  // namespace strata::model
