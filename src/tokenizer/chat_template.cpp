#include "strata/tokenizer/chat_template.h"

#include "utf8.h"

namespace strata::tokenizer {
namespace {

constexpr std::string_view kChatMLSystemStart = "<|im_start|>system";
constexpr std::string_view kChatMLEnd = "<|im_end|>";

// Value of a Jinja (Python-style) string literal body: \n, \t, \r, \\, \', \" are unescaped;
// other escapes are kept as written.
std::string unescape_jinja_literal(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char next = body[++i];
    switch (next) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(next);
        break;
      default:
        out.push_back('\\');
        out.push_back(next);
    }
  }
  return out;
}

// True if `body` (inside a literal delimited by `quote`) contains the closing quote.
bool closes_literal(std::string_view body, char quote) {
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\\') {
      ++i;
    } else if (body[i] == quote) {
      return true;
    }
  }
  return false;
}

// A ChatML default system prompt: a string literal of the form
// '<|im_start|>system\n<text without quotes><|im_end|>...' somewhere in the source (SmolLM2 writes
// it under `if loop.first and messages[0]['role'] != 'system'`, Qwen2.5 in the `else` branch of
// `if messages[0]['role'] == 'system'`). Literals that splice in a message, such as
// '<|im_start|>system\n' + messages[0]['content'], are skipped.
std::optional<std::string> find_default_system_prompt(std::string_view source) {
  for (size_t pos = source.find(kChatMLSystemStart); pos != std::string_view::npos;
       pos = source.find(kChatMLSystemStart, pos + 1)) {
    if (pos == 0) continue;
    const char quote = source[pos - 1];
    if (quote != '\'' && quote != '"') continue;
    size_t body_begin = pos + kChatMLSystemStart.size();
    if (source.substr(body_begin, 2) == "\\n") {
      body_begin += 2;
    } else if (source.substr(body_begin, 1) == "\n") {
      body_begin += 1;
    } else {
      continue;
    }
    const size_t body_end = source.find(kChatMLEnd, body_begin);
    if (body_end == std::string_view::npos) break;
    const std::string_view body = source.substr(body_begin, body_end - body_begin);
    if (body.empty() || closes_literal(body, quote)) continue;
    return unescape_jinja_literal(body);
  }
  return std::nullopt;
}

// Python str.strip() without arguments, which Jinja's trim filter calls.
std::string python_strip(std::string_view text) {
  std::string valid;
  if (!detail::is_valid_utf8(text)) {
    valid = detail::to_valid_utf8(text);
    text = valid;
  }
  size_t begin = 0;
  size_t len = 0;
  while (begin < text.size() &&
         detail::is_python_whitespace(detail::decode_code_point(text, begin, &len))) {
    begin += len;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    if (!detail::is_python_whitespace(detail::decode_code_point(text, start, &len))) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

StatusOr<std::string> render_chatml(std::span<const ChatMessage> messages,
                                    const std::optional<std::string>& default_system,
                                    bool add_generation_prompt) {
  std::string out;
  if (default_system && messages.front().role != "system") {
    out.append("<|im_start|>system\n").append(*default_system).append("<|im_end|>\n");
  }
  for (const ChatMessage& m : messages) {
    out.append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
  }
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
  return out;
}

StatusOr<std::string> render_llama3(std::span<const ChatMessage> messages,
                                    bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) {
    out.append("<|start_header_id|>").append(m.role).append("<|end_header_id|>\n\n");
    out.append(python_strip(m.content)).append("<|eot_id|>");
  }
  if (add_generation_prompt) out.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out;
}

StatusOr<std::string> render_mistral(std::span<const ChatMessage> messages) {
  std::optional<std::string_view> system;
  if (messages.front().role == "system") {
    system = messages.front().content;
    messages = messages.subspan(1);
  }
  std::string out = "<s>";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0)) {
      return invalid_argument_error(
          "Mistral chat template: after an optional system message, roles must alternate "
          "user/assistant/user/...; message " +
          std::to_string(i) + " has role '" + m.role + "'");
    }
    if (m.role == "user") {
      out.append(" [INST] ");
      if (i == 0 && system) out.append(*system).append("\n\n");
      out.append(m.content).append(" [/INST]");
    } else if (m.role == "assistant") {
      out.append(" ").append(m.content).append("</s>");
    } else {
      return invalid_argument_error("Mistral chat template: role '" + m.role +
                                    "' is not supported (only user and assistant, after an "
                                    "optional leading system message)");
    }
  }
  return out;
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

StatusOr<ChatTemplate> ChatTemplate::from_source(std::string_view jinja_source,
                                                 std::optional<ChatTemplateKind> fallback) {
  if (jinja_source.find("<|im_start|>") != std::string_view::npos) {
    ChatTemplate t(ChatTemplateKind::kChatML);
    t.default_system_ = find_default_system_prompt(jinja_source);
    t.encode_add_bos_ = jinja_source.find("bos_token") != std::string_view::npos;
    return t;
  }
  if (jinja_source.find("<|start_header_id|>") != std::string_view::npos) {
    return ChatTemplate(ChatTemplateKind::kLlama3);
  }
  if (jinja_source.find("[INST]") != std::string_view::npos &&
      jinja_source.find("<<SYS>>") == std::string_view::npos) {
    return ChatTemplate(ChatTemplateKind::kMistral);
  }
  if (fallback) return ChatTemplate(*fallback);
  if (jinja_source.empty()) {
    return invalid_argument_error("the model has no chat template and no fallback was given");
  }
  return invalid_argument_error(
      "unrecognised chat template (no <|im_start|>, <|start_header_id|> or [INST] marker) and no "
      "fallback was given; template starts with: " +
      std::string(jinja_source.substr(0, 120)));
}

StatusOr<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                           bool add_generation_prompt) const {
  if (messages.empty()) return invalid_argument_error("cannot render an empty conversation");
  switch (kind_) {
    case ChatTemplateKind::kChatML:
      return render_chatml(messages, default_system_, add_generation_prompt);
    case ChatTemplateKind::kLlama3:
      return render_llama3(messages, add_generation_prompt);
    case ChatTemplateKind::kMistral:
      return render_mistral(messages);
  }
  return internal_error("unknown chat template kind");
}

}  // namespace strata::tokenizer
