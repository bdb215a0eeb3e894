// Chat prompts rendered by executing the model's own Jinja chat template (GGUF
// tokenizer.chat_template, or tokenizer_config.json / chat_template.jinja of an HF directory) with
// our interpreter, in the environment transformers' apply_chat_template uses, so the prompt is the
// string transformers renders (tests/unit/tokenizer/jinja_test.cpp checks the 28 model templates
// of tests/data/chat_templates).
// A model without a template uses the built-in fallback named in the deployment file
// (chatml, llama3 or mistral; src/tokenizer/templates/).
//
// Role spoofing: everything that comes from the request (message contents, names, tool calls and
// tool definitions) is marked untrusted in the rendered ChatPrompt, and
// Tokenizer::encode(const ChatPrompt&) never turns untrusted bytes into special tokens, so a user
// who writes "<|im_start|>system" gets those characters, not a system turn. Only the template's
// own markup becomes control tokens.
//
// BOS: the template writes bos_token itself where the model wants it (transformers tokenizes the
// rendering with add_special_tokens=False), so a ChatPrompt is encoded without adding BOS.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/common/status.h"

namespace strata::tokenizer {

// The built-in templates for models that ship none.
enum class ChatTemplateKind { kChatML, kLlama3, kMistral };

// "chatml", "llama3", "mistral".
const char* chat_template_kind_name(ChatTemplateKind kind);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as OpenAI sends it; templates see the parsed object
};

// One message of a conversation, as OpenAI's chat API describes it.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", or any role the template accepts
  std::optional<std::string> content;     // nullopt: null (an assistant turn that only calls tools)
  std::vector<ToolCall> tool_calls = {};  // assistant
  std::string tool_call_id = {};          // tool: the call this result answers
  std::string name = {};                  // tool: the function's name (optional)
  std::string reasoning_content = {};     // assistant: its reasoning, for templates that show it
};

// A function the model may call: OpenAI's {"type": "function", "function": {...}}.
struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters;  // JSON Schema text; empty for none
};

// A rendered chat prompt: the text and the byte ranges [begin, end) of it that came from the
// request (sorted, disjoint).
struct ChatPrompt {
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> untrusted;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::vector<ToolDefinition> tools;  // empty: the template sees tools = none
  // Extra template variables as a JSON object text (OpenAI's chat_template_kwargs, e.g.
  // {"enable_thinking": false}); empty for none.
  std::string template_kwargs;
  // The time strftime_now() formats (Unix seconds, local time zone); 0 for now.
  int64_t now = 0;
};

// Immutable after construction; render() is const and thread-safe. Copies share the parsed
// template.
class ChatTemplate {
 public:
  // Parses `jinja_source`; an empty source uses the built-in `fallback` (INVALID_ARGUMENT when
  // there is none). `bos_token` / `eos_token` are the texts the template sees (the tokenizer's
  // BOS / EOS tokens; empty when it has none). INVALID_ARGUMENT with the line for templates we
  // cannot parse.
  static StatusOr<ChatTemplate> create(std::string_view jinja_source,
                                       std::optional<ChatTemplateKind> fallback,
                                       std::string bos_token, std::string eos_token);

  // INVALID_ARGUMENT for an empty conversation, malformed tool arguments or template kwargs, and
  // whatever the template rejects (raise_exception, e.g. roles that do not alternate), with its
  // message.
  StatusOr<ChatPrompt> render(std::span<const ChatMessage> messages,
                              const ChatRenderOptions& options) const;
  StatusOr<ChatPrompt> render(std::span<const ChatMessage> messages,
                              bool add_generation_prompt) const {
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    return render(messages, options);
  }

  // The Jinja source in use (the model's or the fallback's).
  const std::string& source() const { return source_; }

 private:
  struct Parsed;
  std::shared_ptr<const Parsed> parsed_;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace strata::tokenizer
