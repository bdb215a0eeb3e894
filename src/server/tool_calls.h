// Tool calls in a model's output, per family, as vLLM's tool parsers read them:
//   kHermes      <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Hermes 2/3,
//                SmolLM3, ...), any number of them after optional content
//   kLlama3Json  the whole reply is {"name": ..., "parameters" | "arguments": {...}}, optionally
//                after <|python_tag|>; several separated by ';' (Llama 3.1 / 3.2 / 3.3)
//   kMistral     [TOOL_CALLS] then a JSON array of {"name", "arguments"} (v3), or one or more
//                name[ARGS]{...} (v11+)
// The family comes from the chat template: the markup its tool section writes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::server {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

// The format the template `source` teaches the model; kNone when it renders no tools.
ToolCallFormat tool_call_format(std::string_view template_source);
const char* tool_call_format_name(ToolCallFormat format);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct ParsedReply {
  std::string content;  // the text outside the calls (trimmed when there are calls)
  std::vector<ParsedToolCall> calls;
};

// Splits a finished reply into content and tool calls. Markup that does not parse as a call
// stays content (the client sees what the model wrote).
ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text);

// While streaming: how many leading bytes of `text` (the reply so far) are content for certain,
// i.e. before any call marker and before a trailing prefix of one. The rest is held back until
// the reply ends.
size_t streamable_prefix(ToolCallFormat format, std::string_view text);

// A new call id: "call_" and 24 random alphanumerics, or 9 for Mistral, whose templates require
// exactly 9.
std::string new_tool_call_id(ToolCallFormat format);

}  // namespace strata::server
