// Model, tokenizer, chat template and executor loaded together from the common CLI flags.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "flags.h"
#include "strata/executor/executor.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/chat_template.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {

// Flags understood by load_model(): --model --device --dtype --threads --chat-template.
const std::set<std::string>& model_flag_names();

struct LoadedModel {
  std::unique_ptr<model::ModelSource> source;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<executor::Executor> executor;
  // nullopt when the model has no usable template and no --chat-template fallback was given.
  std::optional<tokenizer::ChatTemplate> chat_template;
  Status chat_template_error;  // why chat_template is empty
};

StatusOr<LoadedModel> load_model(const Flags& flags);

}  // namespace strata::cli
