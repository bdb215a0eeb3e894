#include "strata/tokenizer/chat_template.h"

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>

#include "builtin_templates.h"
#include "jinja/template.h"
#include "utf8.h"

namespace strata::tokenizer {

using Json = nlohmann::ordered_json;
using jinja::Dict;
using jinja::List;
using jinja::TString;
using jinja::Value;

struct ChatTemplate::Parsed {
  jinja::Template jinja;
};

namespace {

// Request text, made valid UTF-8 (invalid sequences become U+FFFD, as encode() would make them)
// so that the rendered prompt's untrusted byte ranges stay aligned through encoding.
Value untrusted(const std::string& s) {
  return Value(TString::untrusted(detail::is_valid_utf8(s) ? s : detail::to_valid_utf8(s)));
}

// The parsed JSON text `text` (an object for tool arguments and schemas), marked untrusted.
StatusOr<Value> json_value(const std::string& text, const std::string& what) {
  Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return invalid_argument_error(what + " is not valid JSON: " + text);
  return jinja::from_json(parsed, true);
}

// A message as the template sees it: the keys transformers' callers pass, only those that are
// set (templates test `message.tool_calls is defined`). Reasoning is also given as `thinking`, as
// transformers aliases it for gpt-oss-style templates.
StatusOr<Value> message_value(const ChatMessage& m, size_t index) {
  auto d = std::make_shared<Dict>();
  if (!m.reasoning_content.empty()) d->set("thinking", untrusted(m.reasoning_content));
  d->set("role", untrusted(m.role));
  d->set("content", m.content ? untrusted(*m.content) : Value::none());
  if (!m.tool_calls.empty()) {
    List calls;
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const ToolCall& call = m.tool_calls[k];
      const std::string at = "messages[" + std::to_string(index) + "].tool_calls[" +
                             std::to_string(k) + "].function.arguments";
      // Templates format arguments with tojson or iterate them: they expect the object that
      // OpenAI's JSON text stands for (as vLLM passes it).
      STRATA_ASSIGN_OR_RETURN(Value arguments,
                              json_value(call.arguments.empty() ? "{}" : call.arguments, at));
      auto function = std::make_shared<Dict>();
      function->set("name", untrusted(call.name));
      function->set("arguments", std::move(arguments));
      auto entry = std::make_shared<Dict>();
      entry->set("id", untrusted(call.id));
      entry->set("type", Value("function"));
      entry->set("function", Value::dict(std::move(function)));
      calls.push_back(Value::dict(std::move(entry)));
    }
    d->set("tool_calls", Value::list(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) d->set("tool_call_id", untrusted(m.tool_call_id));
  if (!m.name.empty()) d->set("name", untrusted(m.name));
  if (!m.reasoning_content.empty()) d->set("reasoning_content", untrusted(m.reasoning_content));
  return Value::dict(std::move(d));
}

StatusOr<Value> tools_value(const std::vector<ToolDefinition>& tools) {
  if (tools.empty()) return Value::none();
  List out;
  for (size_t k = 0; k < tools.size(); ++k) {
    const ToolDefinition& tool = tools[k];
    auto function = std::make_shared<Dict>();
    function->set("name", untrusted(tool.name));
    if (!tool.description.empty()) function->set("description", untrusted(tool.description));
    if (!tool.parameters.empty()) {
      STRATA_ASSIGN_OR_RETURN(
          Value parameters,
          json_value(tool.parameters, "tools[" + std::to_string(k) + "].function.parameters"));
      function->set("parameters", std::move(parameters));
    }
    auto entry = std::make_shared<Dict>();
    entry->set("type", Value("function"));
    entry->set("function", Value::dict(std::move(function)));
    out.push_back(Value::dict(std::move(entry)));
  }
  return Value::list(std::move(out));
}

}  // namespace

const char* chat_template_kind_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML:
      return "chatml";
    case ChatTemplateKind::kLlama3:
      return "llama3";
    case ChatTemplateKind::kMistral:
      return "mistral";
  }
  return "unknown";
}

StatusOr<ChatTemplate> ChatTemplate::create(std::string_view jinja_source,
                                            std::optional<ChatTemplateKind> fallback,
                                            std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  if (!jinja_source.empty()) {
    t.source_ = std::string(jinja_source);
  } else if (fallback) {
    t.source_ = std::string(builtin_chat_template(*fallback));
  } else {
    return invalid_argument_error(
        "the model has no chat template and no fallback was given (set model.chat_template to "
        "chatml, llama3 or mistral)");
  }
  if (!detail::is_valid_utf8(t.source_)) {
    return invalid_argument_error("the chat template is not valid UTF-8");
  }
  STRATA_ASSIGN_OR_RETURN(jinja::Template parsed, jinja::Template::parse(t.source_));
  t.parsed_ = std::make_shared<const Parsed>(Parsed{std::move(parsed)});
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

StatusOr<ChatPrompt> ChatTemplate::render(std::span<const ChatMessage> messages,
                                          const ChatRenderOptions& options) const {
  if (messages.empty()) return invalid_argument_error("cannot render an empty conversation");
  List message_values;
  for (size_t i = 0; i < messages.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(Value v, message_value(messages[i], i));
    message_values.push_back(std::move(v));
  }
  STRATA_ASSIGN_OR_RETURN(Value tools, tools_value(options.tools));
  std::vector<std::pair<std::string, Value>> variables = {
      {"messages", Value::list(std::move(message_values))},
      {"tools", std::move(tools)},
      {"documents", Value::none()},
      {"add_generation_prompt", Value(options.add_generation_prompt)},
      {"bos_token", Value(bos_token_)},
      {"eos_token", Value(eos_token_)},
  };
  if (!options.template_kwargs.empty()) {
    const Json kwargs = Json::parse(options.template_kwargs, nullptr, false);
    if (!kwargs.is_object()) {
      return invalid_argument_error("chat_template_kwargs must be a JSON object");
    }
    for (const auto& item : kwargs.items()) {
      const std::string& key = item.key();
      // The request may not replace what the server passes (messages, bos_token, ...).
      const bool reserved = std::any_of(variables.begin(), variables.end(),
                                        [&](const auto& v) { return v.first == key; });
      if (reserved) {
        return invalid_argument_error("chat_template_kwargs cannot set '" + key + "'");
      }
      variables.emplace_back(key, jinja::from_json(item.value(), true));
    }
  }
  STRATA_ASSIGN_OR_RETURN(
      TString rendered,
      parsed_->jinja.render(variables, options.now != 0 ? options.now : std::time(nullptr)));
  ChatPrompt prompt;
  prompt.text = std::move(rendered.text);
  for (const jinja::Span& span : rendered.tainted)
    prompt.untrusted.emplace_back(span.begin, span.end);
  return prompt;
}

}  // namespace strata::tokenizer
