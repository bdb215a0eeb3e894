// Chat prompt rendering for the template families we serve. We do not run Jinja: the family is
// recognised from markers in the model's Jinja source and rendered by hand-written code whose
// output equals transformers' apply_chat_template(tokenize=False) for that family's canonical
// template (the templates are reproduced in tests/reference/tokenizer_reference.py):
//
//   kChatML   "<|im_start|>{role}\n{content}<|im_end|>\n" per message; generation prompt
//             "<|im_start|>assistant\n". A default system prompt written as a literal in the source
//             (SmolLM2, Qwen2.5) is inserted when the first message is not a system message. A
//             source that mentions bos_token is taken to write it first (see encode_add_bos()).
//   kLlama3   "<|begin_of_text|>" then "<|start_header_id|>{role}<|end_header_id|>\n\n
//             {content|trim}<|eot_id|>" per message; generation prompt
//             "<|start_header_id|>assistant<|end_header_id|>\n\n". (Meta-Llama-3-Instruct; the
//             3.1+ "Cutting Knowledge Date" system preamble and tool formats are not reproduced.)
//   kMistral  "<s>" then " [INST] {content} [/INST]" per user and " {content}</s>" per assistant
//             message; an optional leading system message is prepended to the first user message
//             with "\n\n"; roles must alternate user/assistant (Mistral-7B-Instruct-v0.2 and
//             Mixtral-8x7B-Instruct, tokenizer v1; add_generation_prompt has no effect).
//
// BOS: the Llama 3 and Mistral renderings begin with the BOS token's text, which encode() turns
// into the BOS id, as apply_chat_template(tokenize=True) does. Encode render() output with
// encode(text, chat_template.encode_add_bos()), not with Tokenizer::add_bos_by_default(): the
// template, not the tokenizer's default, decides whether a chat prompt starts with BOS.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "strata/common/status.h"

namespace strata::tokenizer {

enum class ChatTemplateKind { kChatML, kLlama3, kMistral };

// "chatml", "llama3", "mistral".
const char* chat_template_kind_name(ChatTemplateKind kind);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", or any other role the family accepts
  std::string content;
};

// Immutable value type; render() is const and thread-safe.
class ChatTemplate {
 public:
  // Recognises the family from `jinja_source`: "<|im_start|>" -> kChatML, "<|start_header_id|>"
  // -> kLlama3, "[INST]" (without Llama 2's "<<SYS>>") -> kMistral. A source with no known marker
  // (or an empty one) uses `fallback`; without a fallback it is INVALID_ARGUMENT.
  static StatusOr<ChatTemplate> from_source(std::string_view jinja_source,
                                            std::optional<ChatTemplateKind> fallback);
  // A template of `kind` with no default system prompt and no BOS for ChatML.
  explicit ChatTemplate(ChatTemplateKind kind) : kind_(kind) {}

  // The prompt for `messages`, ending with the assistant header when `add_generation_prompt`
  // (kChatML, kLlama3). INVALID_ARGUMENT for an empty conversation, and for kMistral when roles do
  // not alternate user/assistant after an optional leading system message (transformers raises a
  // TemplateError there).
  StatusOr<std::string> render(std::span<const ChatMessage> messages,
                               bool add_generation_prompt) const;

  ChatTemplateKind kind() const { return kind_; }
  // The add_bos argument for Tokenizer::encode() of render() output: false when the rendering
  // already starts with the BOS text (kLlama3, kMistral) or the template writes no BOS (plain
  // ChatML); true for ChatML templates that write bos_token (Hermes-2-Pro-Llama-3 style), whose
  // BOS text render() leaves out because it depends on the tokenizer.
  bool encode_add_bos() const { return encode_add_bos_; }
  // kChatML only: the system prompt inserted when the conversation does not start with one.
  const std::optional<std::string>& default_system_prompt() const { return default_system_; }

 private:
  ChatTemplateKind kind_;
  std::optional<std::string> default_system_;
  bool encode_add_bos_ = false;
};

}  // namespace strata::tokenizer
