// An engine plus chat template built from the common CLI flags.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "flags.h"
#include "strata/engine/engine.h"
#include "strata/tokenizer/chat_template.h"

namespace strata::cli {

// Flags understood by load_engine(): model, device and engine sizing.
const std::set<std::string>& engine_flag_names();

struct LoadedEngine {
  std::unique_ptr<engine::Engine> engine;
  // nullopt when the model has no usable template and no --chat-template fallback was given.
  std::optional<tokenizer::ChatTemplate> chat_template;
  Status chat_template_error;  // why chat_template is empty
};

StatusOr<LoadedEngine> load_engine(const Flags& flags);

// Sampling flags shared by generate and chat: --temperature --top-p --top-k --min-p
// --repetition-penalty --presence-penalty --frequency-penalty --seed --max-tokens --stop
// --ignore-eos (a switch).
const std::set<std::string>& sampling_flag_names();
StatusOr<sampling::SamplingParams> parse_sampling(const Flags& flags, double default_temperature,
                                                  int64_t default_max_tokens);

}  // namespace strata::cli
