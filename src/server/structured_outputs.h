// Private to the HTTP server: the grammars of structured outputs (response_format json_object /
// json_schema) and of forced tool calls (tool_choice "required" or a named function), compiled
// once per distinct request text and shared by the requests that repeat it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "openai_protocol.h"
#include "strata/sampling/grammar.h"
#include "strata/tokenizer/tokenizer.h"
#include "tool_calls.h"

namespace strata::server {

class StructuredOutputs {
 public:
  explicit StructuredOutputs(const tokenizer::Tokenizer& tokenizer);

  // The grammar `request` must follow (null: none). A forced tool call is written in the model's
  // `format`. INVALID_ARGUMENT naming the field for schemas we cannot enforce.
  StatusOr<std::shared_ptr<const sampling::Grammar>> grammar_for(
      const openai::ParsedRequest& request, ToolCallFormat format);

 private:
  std::shared_ptr<const sampling::TokenTable> tokens_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const sampling::Grammar>> cache_;  // by request text
};

}  // namespace strata::server
