// ModelSource over a HF model directory: config.json + *.safetensors + tokenizer.json
// (private to the model module).
#pragma once

#include <memory>
#include <string>

#include "strata/model/model_source.h"

namespace strata::model {

StatusOr<std::unique_ptr<ModelSource>> open_hf_source(const std::string& directory);

}  // namespace strata::model
