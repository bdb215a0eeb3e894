// The sampling defaults a deployment gives requests that leave fields unset: the deployment
// file's sampling section, with the model's own defaults laid over it (as vLLM applies a model's
// generation_config.json).
#pragma once

#include <string>

#include "strata/common/status.h"
#include "strata/config/deployment_config.h"
#include "strata/model/gguf_file.h"
#include "strata/sampling/sampling_params.h"

namespace strata::cli {

// The model's own sampling defaults, the keys vLLM reads from generation_config.json: the GGUF's
// general.sampling.* metadata (llama.cpp's keys temp, top_k, top_p, min_p, penalty_repeat) when
// `gguf` is given, else `model_dir`/generation_config.json (none when that file is absent; keys
// of other types are ignored). INVALID_ARGUMENT for a GGUF key of the wrong type; DATA_LOSS for
// a generation_config.json that is not a JSON object.
StatusOr<sampling::SamplingDefaults> model_sampling_defaults(const model::GgufFile* gguf,
                                                             const std::string& model_dir);

// `deployment` with, when its use_generation_config is set, model_sampling_defaults() over it;
// logs the model's defaults (if any) and the result. INVALID_ARGUMENT when the model's defaults
// are out of range.
StatusOr<sampling::SamplingDefaults> resolve_sampling_defaults(
    const config::SamplingSection& deployment, const model::GgufFile* gguf,
    const std::string& model_dir);

}  // namespace strata::cli
