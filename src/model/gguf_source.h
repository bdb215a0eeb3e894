// ModelSource over a GGUF file (private to the model module).
#pragma once

#include <memory>
#include <string>

#include "strata/model/model_source.h"

namespace strata::model {

StatusOr<std::unique_ptr<ModelSource>> open_gguf_source(const std::string& path);

// Undoes the GGUF `llama` converter's Q/K row interleaving for one projection
// [num_heads * head_dim, row_len]: GGUF row h*D + 2j + t holds HF row h*D + t*D/2 + j.
void unpermute_rope_rows(std::span<float> weight, int64_t num_heads, int64_t head_dim,
                         int64_t row_len);

}  // namespace strata::model
