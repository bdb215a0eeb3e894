// The deployment a command runs (config file, then command-line flags, then --set overrides) and
// the engine built from it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "flags.h"
#include "strata/config/deployment_config.h"
#include "strata/dist/communicator.h"
#include "strata/engine/engine.h"
#include "strata/tokenizer/chat_template.h"

namespace strata::cli {

// Flags that shape the deployment: --config FILE, the model/engine/server shortcuts (--model,
// --device, --dtype, --threads, --kv-cache-mib, --block-size, --max-num-seqs,
// --max-batched-tokens, --chat-template, --chat-template-file, --served-name, --host, --grpc-port,
// --http-port,
// --grace-seconds), and the repeatable --set section.key=value.
const std::set<std::string>& deployment_flag_names();
const std::set<std::string>& deployment_repeated_flag_names();

// configs file (or built-in defaults) -> flag shortcuts -> --set overrides -> validate().
// INVALID_ARGUMENT naming the key or flag on any bad value; NOT_FOUND for a missing file.
StatusOr<config::DeploymentConfig> deployment_from_flags(const Flags& flags);

struct LoadedEngine {
  std::unique_ptr<engine::Engine> engine;
  // nullopt when the model has no usable template and no chat_template fallback was configured.
  std::optional<tokenizer::ChatTemplate> chat_template;
  Status chat_template_error;  // why chat_template is empty
  // What requests' unset sampling fields take: the model's own defaults over the deployment
  // file's sampling section (see config::SamplingSection).
  sampling::SamplingParams sampling_defaults;
};

// The tokenizer of a model: its GGUF metadata, or the HF directory's tokenizer.json.
StatusOr<std::unique_ptr<tokenizer::Tokenizer>> open_tokenizer(const model::ModelSource& source);

// Opens the model and tokenizer and builds the engine; with devices.tensor_parallel_size > 1, as
// rank 0 of `group` (UNIMPLEMENTED without one), calling on_group_failure when the group fails.
StatusOr<LoadedEngine> load_engine(const config::DeploymentConfig& deployment,
                                   dist::Communicator* group = nullptr,
                                   std::function<void(const Status&)> on_group_failure = {});

// A rank > 0 of a tensor-parallel group: runs rank 0's passes on its part of the model until
// rank 0 stops it (OK) or the group fails (executor::serve_tensor_parallel_rank).
Status serve_rank(const config::DeploymentConfig& deployment, dist::Communicator& group);

// Sampling flags shared by generate and chat: --temperature --top-p --top-k --min-p
// --repetition-penalty --presence-penalty --frequency-penalty --seed --max-tokens --stop
// --ignore-eos (a switch).
const std::set<std::string>& sampling_flag_names();
StatusOr<sampling::SamplingParams> parse_sampling(const Flags& flags, double default_temperature,
                                                  int64_t default_max_tokens);

}  // namespace strata::cli
