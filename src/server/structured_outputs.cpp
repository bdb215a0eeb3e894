#include "structured_outputs.h"

#include <nlohmann/json.hpp>

namespace strata::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxCachedGrammars = 64;

// The schema of one call of `tool` in `format`'s JSON shape.
Json call_schema(const tokenizer::ToolDefinition& tool, ToolCallFormat format) {
  const char* arguments = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  Json parameters =
      tool.parameters.empty() ? Json{{"type", "object"}} : Json::parse(tool.parameters);
  return Json{
      {"type", "object"},
      {"properties", {{"name", {{"const", tool.name}}}, {arguments, std::move(parameters)}}},
      {"required", {"name", arguments}},
      {"additionalProperties", false}};
}

}  // namespace

StructuredOutputs::StructuredOutputs(const tokenizer::Tokenizer& tokenizer) {
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer.vocab_size()));
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    // Control tokens never appear inside structured text.
    if (!tokenizer.is_special(id)) bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  }
  tokens_ = std::make_shared<const sampling::TokenTable>(std::move(bytes), tokenizer.stop_ids());
}

StatusOr<std::shared_ptr<const sampling::Grammar>> StructuredOutputs::grammar_for(
    const openai::ParsedRequest& request, ToolCallFormat format) {
  using Format = openai::ParsedRequest::Format;
  std::string prefix, suffix, schema;
  if (request.forced_tool) {
    if (format == ToolCallFormat::kNone) {
      return invalid_argument_error("tool_choice: the chat template writes no tool-call format");
    }
    Json options = Json::array();
    for (const tokenizer::ToolDefinition& tool : request.tools) {
      if (request.forced_tool->empty() || tool.name == *request.forced_tool) {
        options.push_back(call_schema(tool, format));
      }
    }
    schema = (options.size() == 1 ? options[0] : Json{{"anyOf", options}}).dump();
    if (format == ToolCallFormat::kHermes) {
      prefix = "<tool_call>\n";
      suffix = "\n</tool_call>";
    } else if (format == ToolCallFormat::kMistral) {
      prefix = "[TOOL_CALLS][";
      suffix = "]";
    }
  } else if (request.format == Format::kJsonSchema) {
    schema = request.json_schema;
  } else if (request.format != Format::kJsonObject) {
    return std::shared_ptr<const sampling::Grammar>();
  }
  const std::string key = prefix + '\0' + schema + '\0' + suffix;
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  std::shared_ptr<const sampling::Grammar> grammar;
  if (schema.empty()) {
    grammar = sampling::Grammar::any_json_object(tokens_);
  } else {
    STRATA_ASSIGN_OR_RETURN(
        grammar, sampling::Grammar::wrapped_json_schema(prefix, schema, suffix, tokens_));
  }
  if (cache_.size() >= kMaxCachedGrammars) cache_.clear();
  cache_.emplace(key, grammar);
  return grammar;
}

}  // namespace strata::server
