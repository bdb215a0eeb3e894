#include "tool_calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

namespace strata::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The JSON value at the start of `text` and how many bytes it takes; nullopt when none parses.
std::optional<std::pair<Json, size_t>> leading_json(std::string_view text) {
  // Find the end of the first balanced {...} or [...] outside strings, then parse that.
  if (text.empty() || (text[0] != '{' && text[0] != '[')) return std::nullopt;
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') {
      if (--depth == 0) {
        Json parsed = Json::parse(text.substr(0, i + 1), nullptr, /*allow_exceptions=*/false);
        if (parsed.is_discarded()) return std::nullopt;
        return std::make_pair(std::move(parsed), i + 1);
      }
    }
  }
  return std::nullopt;
}

// {"name": ..., "arguments" | "parameters": {...}} as a call; nullopt for anything else.
std::optional<ParsedToolCall> call_of(const Json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const Json* args = nullptr;
  if (j.contains("arguments")) args = &j["arguments"];
  if (j.contains("parameters")) args = &j["parameters"];
  ParsedToolCall call{j["name"].get<std::string>(), "{}"};
  if (args != nullptr) {
    if (args->is_string()) {  // arguments already as JSON text
      call.arguments = args->get<std::string>();
    } else if (args->is_object()) {
      call.arguments = args->dump();
    } else {
      return std::nullopt;
    }
  }
  return call;
}

ParsedReply parse_hermes(std::string_view text) {
  const size_t first = text.find(kHermesOpen);
  if (first == std::string_view::npos) return {std::string(text), {}};
  ParsedReply reply;
  std::string content(text.substr(0, first));
  size_t pos = first;
  while (pos < text.size()) {
    const size_t open = text.find(kHermesOpen, pos);
    if (open == std::string_view::npos) {
      content.append(text.substr(pos));
      break;
    }
    content.append(text.substr(pos, open - pos));
    // The JSON is read first, so a "</tool_call>" inside its strings does not end the call; the
    // closing tag may be missing when the reply was cut at the stop token.
    size_t at = open + kHermesOpen.size();
    while (at < text.size() && is_space(text[at])) ++at;
    const std::optional<std::pair<Json, size_t>> json = leading_json(text.substr(at));
    std::optional<ParsedToolCall> call = json ? call_of(json->first) : std::nullopt;
    size_t end = call ? at + json->second : open;
    if (call) {
      while (end < text.size() && is_space(text[end])) ++end;
      if (text.substr(end, kHermesClose.size()) == kHermesClose) {
        end += kHermesClose.size();
      } else if (end != text.size()) {
        call.reset();
      }
    }
    if (!call) {  // not a call: the markup stays content, up to the next tag
      const size_t next = text.find(kHermesOpen, open + kHermesOpen.size());
      end = next == std::string_view::npos ? text.size() : next;
      content.append(text.substr(open, end - open));
    } else {
      reply.calls.push_back(std::move(*call));
    }
    pos = end;
  }
  if (reply.calls.empty()) return {std::string(text), {}};
  reply.content = std::string(trim(content));
  return reply;
}

ParsedReply parse_llama3(std::string_view text) {
  std::string_view body = trim(text);
  if (body.substr(0, kPythonTag.size()) == kPythonTag) body = trim(body.substr(kPythonTag.size()));
  ParsedReply reply;
  while (!body.empty()) {
    const std::optional<std::pair<Json, size_t>> json = leading_json(body);
    std::optional<ParsedToolCall> call = json ? call_of(json->first) : std::nullopt;
    if (!call) return {std::string(text), {}};
    reply.calls.push_back(std::move(*call));
    body = trim(body.substr(json->second));
    if (!body.empty() && body.front() == ';') body = trim(body.substr(1));
  }
  if (reply.calls.empty()) return {std::string(text), {}};
  return reply;
}

ParsedReply parse_mistral(std::string_view text) {
  const size_t marker = text.find(kMistralMarker);
  if (marker == std::string_view::npos) return {std::string(text), {}};
  ParsedReply reply;
  std::string_view rest = trim(text.substr(marker + kMistralMarker.size()));
  if (!rest.empty() && rest.front() == '[') {  // v3: a JSON array of calls
    const std::optional<std::pair<Json, size_t>> json = leading_json(rest);
    if (!json || !json->first.is_array()) return {std::string(text), {}};
    for (const Json& item : json->first) {
      std::optional<ParsedToolCall> call = call_of(item);
      if (!call) return {std::string(text), {}};
      reply.calls.push_back(std::move(*call));
    }
  } else {  // v11+: name[ARGS]{...}, repeated with [TOOL_CALLS] between calls
    while (!rest.empty()) {
      size_t args = rest.find(kMistralArgs);
      size_t json_at = args == std::string_view::npos ? rest.find('{') : args + kMistralArgs.size();
      if (json_at == std::string_view::npos) return {std::string(text), {}};
      const std::string_view name =
          trim(rest.substr(0, args == std::string_view::npos ? json_at : args));
      const std::optional<std::pair<Json, size_t>> json = leading_json(trim(rest.substr(json_at)));
      if (name.empty() || !json || !json->first.is_object()) return {std::string(text), {}};
      reply.calls.push_back({std::string(name), json->first.dump()});
      rest = trim(trim(rest.substr(json_at)).substr(json->second));
      if (rest.substr(0, kMistralMarker.size()) == kMistralMarker) {
        rest = trim(rest.substr(kMistralMarker.size()));
      }
    }
  }
  reply.content = std::string(trim(text.substr(0, marker)));
  return reply;
}

// Bytes of `text` before `marker`, or before a trailing partial `marker`.
size_t before_marker(std::string_view text, std::string_view marker) {
  const size_t at = text.find(marker);
  if (at != std::string_view::npos) return at;
  for (size_t keep = std::min(marker.size() - 1, text.size()); keep > 0; --keep) {
    if (text.substr(text.size() - keep) == marker.substr(0, keep)) return text.size() - keep;
  }
  return text.size();
}

}  // namespace

ToolCallFormat tool_call_format(std::string_view source) {
  if (source.find(kMistralMarker) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find("<|start_header_id|>") != std::string_view::npos &&
      source.find("tools") != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "none";
}

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return parse_hermes(text);
    case ToolCallFormat::kLlama3Json:
      return parse_llama3(text);
    case ToolCallFormat::kMistral:
      return parse_mistral(text);
    case ToolCallFormat::kNone:
      break;
  }
  return {std::string(text), {}};
}

size_t streamable_prefix(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return before_marker(text, kHermesOpen);
    case ToolCallFormat::kMistral:
      return before_marker(text, kMistralMarker);
    case ToolCallFormat::kLlama3Json: {
      // A call is the whole reply: hold everything while it could still be one.
      // Whitespace so far, a '{', or (a prefix of) <|python_tag|> may still begin one.
      const std::string_view body = trim(text);
      const bool maybe_call =
          body.empty() || body.front() == '{' ||
          kPythonTag.substr(0, body.size()) == body.substr(0, kPythonTag.size());
      return maybe_call ? 0 : text.size();
    }
    case ToolCallFormat::kNone:
      break;
  }
  return text.size();
}

std::string new_tool_call_id(ToolCallFormat format) {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  const size_t n = format == ToolCallFormat::kMistral ? 9 : 24;
  std::string id = format == ToolCallFormat::kMistral ? "" : "call_";
  for (size_t i = 0; i < n; ++i) id.push_back(kAlphabet[pick(rng)]);
  return id;
}

}  // namespace strata::server
