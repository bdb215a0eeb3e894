#include "chat_request.h"

#include <algorithm>

namespace strata::server::openai {
namespace {

StatusOr<std::string> parse_content(const Json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return type_error(field, "a string or an array of content parts", content);
  }
  // Text parts are joined with newlines, as vLLM does.
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string at = field + "[" + std::to_string(j) + "]";
    if (!part.is_object()) return type_error(at, "a content part object", part);
    const Json* type = find_field(part, "type");
    if (type == nullptr || !type->is_string() || *type != "text") {
      return field_error(at + ".type", (type == nullptr ? std::string("(missing)") : type->dump()) +
                                           " is not supported (only \"text\" parts are)");
    }
    const Json* part_text = find_field(part, "text");
    if (part_text == nullptr || !part_text->is_string()) {
      return field_error(at + ".text", "expected a string");
    }
    if (j > 0) text += '\n';
    text += part_text->get_ref<const std::string&>();
  }
  return text;
}

StatusOr<std::string> required_string(const Json& object, const std::string& name,
                                      const std::string& at) {
  const Json* v = find_field(object, name);
  if (v == nullptr) return field_error(at + "." + name, "is required");
  if (!v->is_string()) return type_error(at + "." + name, "a string", *v);
  return v->get<std::string>();
}

StatusOr<std::vector<tokenizer::ToolCall>> parse_tool_calls(const Json& calls,
                                                            const std::string& at) {
  if (!calls.is_array()) return type_error(at, "an array of tool calls", calls);
  std::vector<tokenizer::ToolCall> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string item = at + "[" + std::to_string(k) + "]";
    const Json& call = calls[k];
    if (!call.is_object()) return type_error(item, "a tool call object", call);
    const Json* function = find_field(call, "function");
    if (function == nullptr) return field_error(item + ".function", "is required");
    if (!function->is_object()) return type_error(item + ".function", "an object", *function);
    tokenizer::ToolCall parsed;
    STRATA_ASSIGN_OR_RETURN(parsed.id, required_string(call, "id", item));
    STRATA_ASSIGN_OR_RETURN(parsed.name, required_string(*function, "name", item + ".function"));
    STRATA_ASSIGN_OR_RETURN(parsed.arguments,
                            required_string(*function, "arguments", item + ".function"));
    out.push_back(std::move(parsed));
  }
  return out;
}

StatusOr<std::vector<tokenizer::ChatMessage>> parse_messages(const Json& root) {
  const Json* messages = find_field(root, "messages");
  if (messages == nullptr) return field_error("messages", "is required");
  if (!messages->is_array()) return type_error("messages", "an array of messages", *messages);
  if (messages->empty()) return field_error("messages", "must not be empty");
  std::vector<tokenizer::ChatMessage> out;
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return type_error(at, "a message object", m);
    tokenizer::ChatMessage message;
    STRATA_ASSIGN_OR_RETURN(message.role, required_string(m, "role", at));
    if (message.role == "developer") message.role = "system";  // OpenAI's newer name
    const std::string& role = message.role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return field_error(at + ".role", "'" + role + "' is not system, user, assistant or tool");
    }
    if (const Json* c = find_field(m, "content")) {
      STRATA_ASSIGN_OR_RETURN(message.content, parse_content(*c, at + ".content"));
    } else if (role != "assistant") {  // an assistant turn that only called tools has none
      return field_error(at + ".content", "is required");
    }
    if (const Json* calls = find_field(m, "tool_calls")) {
      if (role != "assistant")
        return field_error(at + ".tool_calls", "only assistant messages make tool calls");
      STRATA_ASSIGN_OR_RETURN(message.tool_calls, parse_tool_calls(*calls, at + ".tool_calls"));
    }
    if (role == "tool") {
      STRATA_ASSIGN_OR_RETURN(message.tool_call_id, required_string(m, "tool_call_id", at));
    }
    STRATA_ASSIGN_OR_RETURN(std::optional<std::string> name, string_field(m, "name"));
    message.name = name.value_or("");
    STRATA_ASSIGN_OR_RETURN(std::optional<std::string> reasoning,
                            string_field(m, "reasoning_content"));
    message.reasoning_content = reasoning.value_or("");
    out.push_back(std::move(message));
  }
  return out;
}

StatusOr<std::vector<tokenizer::ToolDefinition>> parse_tools(const Json& tools) {
  if (!tools.is_array()) return type_error("tools", "an array of tools", tools);
  std::vector<tokenizer::ToolDefinition> out;
  for (size_t k = 0; k < tools.size(); ++k) {
    const std::string at = "tools[" + std::to_string(k) + "]";
    const Json& tool = tools[k];
    if (!tool.is_object()) return type_error(at, "a tool object", tool);
    STRATA_ASSIGN_OR_RETURN(std::string type, required_string(tool, "type", at));
    if (type != "function") return field_error(at + ".type", "only \"function\" tools exist");
    const Json* function = find_field(tool, "function");
    if (function == nullptr) return field_error(at + ".function", "is required");
    if (!function->is_object()) return type_error(at + ".function", "an object", *function);
    tokenizer::ToolDefinition definition;
    STRATA_ASSIGN_OR_RETURN(definition.name, required_string(*function, "name", at + ".function"));
    STRATA_ASSIGN_OR_RETURN(std::optional<std::string> description,
                            string_field(*function, "description"));
    definition.description = description.value_or("");
    if (const Json* parameters = find_field(*function, "parameters")) {
      if (!parameters->is_object()) {
        return type_error(at + ".function.parameters", "a JSON Schema object", *parameters);
      }
      definition.parameters = parameters->dump();
    }
    out.push_back(std::move(definition));
  }
  return out;
}

}  // namespace

Status parse_chat_fields(const Json& root, ParsedRequest* out) {
  STRATA_ASSIGN_OR_RETURN(out->messages, parse_messages(root));
  if (const Json* tools = find_field(root, "tools")) {
    STRATA_ASSIGN_OR_RETURN(out->tools, parse_tools(*tools));
  }
  out->use_tools = !out->tools.empty();
  if (const Json* choice = find_field(root, "tool_choice")) {
    if (choice->is_string() && *choice == "none") {
      out->use_tools = false;  // as vLLM: the tools stay out of the prompt
    } else if (choice->is_string() && *choice == "auto") {
      if (out->tools.empty()) return field_error("tool_choice", "\"auto\" needs tools");
    } else if (choice->is_string() && *choice == "required") {
      if (out->tools.empty()) return field_error("tool_choice", "\"required\" needs tools");
      out->forced_tool = "";
    } else if (choice->is_object()) {
      const Json* function = find_field(*choice, "function");
      if (function == nullptr || !function->is_object()) {
        return field_error("tool_choice.function", "is required");
      }
      STRATA_ASSIGN_OR_RETURN(std::string name,
                              required_string(*function, "name", "tool_choice.function"));
      const bool known = std::any_of(out->tools.begin(), out->tools.end(),
                                     [&](const auto& t) { return t.name == name; });
      if (!known) return field_error("tool_choice.function.name", "'" + name + "' is not in tools");
      out->forced_tool = std::move(name);
    } else {
      return type_error("tool_choice", "\"none\", \"auto\", \"required\" or a function", *choice);
    }
  }
  if (const Json* format = find_field(root, "response_format")) {
    if (!format->is_object()) return type_error("response_format", "an object", *format);
    STRATA_ASSIGN_OR_RETURN(std::string type, required_string(*format, "type", "response_format"));
    if (type == "json_object") {
      out->format = ParsedRequest::Format::kJsonObject;
    } else if (type == "json_schema") {
      const Json* spec = find_field(*format, "json_schema");
      if (spec == nullptr || !spec->is_object()) {
        return field_error("response_format.json_schema", "is required (an object)");
      }
      const Json* schema = find_field(*spec, "schema");
      if (schema == nullptr || !(schema->is_object() || schema->is_boolean())) {
        return field_error("response_format.json_schema.schema", "is required (a JSON Schema)");
      }
      out->format = ParsedRequest::Format::kJsonSchema;
      out->json_schema = schema->dump();
    } else if (type != "text") {
      return field_error("response_format.type",
                         "'" + type + "' is not text, json_object or json_schema");
    }
    if (out->format != ParsedRequest::Format::kText && out->forced_tool) {
      return field_error("response_format", "cannot be combined with a forced tool_choice");
    }
  }
  if (const Json* kwargs = find_field(root, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return type_error("chat_template_kwargs", "an object", *kwargs);
    out->chat_template_kwargs = kwargs->dump();
  }
  return Status::ok_status();
}

}  // namespace strata::server::openai
