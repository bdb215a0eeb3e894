// What the bench programs on the executor (krul_bench, codec_quality_bench) open: a GGUF model,
// its tokenizer and its chat template, and conversations rendered to the token ids the served
// path would run.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/bench/workload.h"
#include "strata/common/ids.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/chat_template.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::bench {

struct ChatModel {
  std::unique_ptr<model::ModelSource> source;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::optional<tokenizer::ChatTemplate> chat;

  // The messages' token ids, the template's generation prompt after them when asked.
  StatusOr<std::vector<TokenId>> render(const std::vector<Message>& messages,
                                        bool add_generation_prompt) const {
    std::vector<tokenizer::ChatMessage> m;
    for (const Message& message : messages) m.push_back({message.role, message.content});
    STRATA_ASSIGN_OR_RETURN(tokenizer::ChatPrompt prompt, chat->render(m, add_generation_prompt));
    return tokenizer->encode(prompt);
  }
};

// INVALID_ARGUMENT naming `program` for a model that is not a GGUF file.
inline StatusOr<ChatModel> open_chat_model(const std::string& path, const std::string& program) {
  ChatModel m;
  STRATA_ASSIGN_OR_RETURN(m.source, model::open_model_source(path));
  const model::GgufFile* gguf = m.source->gguf();
  if (gguf == nullptr) return invalid_argument_error(program + " reads GGUF models");
  STRATA_ASSIGN_OR_RETURN(m.tokenizer, tokenizer::Tokenizer::from_gguf(*gguf));
  auto text_of = [&](std::optional<TokenId> id) {
    return id ? m.tokenizer->token_bytes(*id) : std::string();
  };
  STRATA_ASSIGN_OR_RETURN(
      tokenizer::ChatTemplate chat,
      tokenizer::ChatTemplate::create(m.tokenizer->chat_template_source(), std::nullopt,
                                      text_of(m.tokenizer->bos_id()),
                                      text_of(m.tokenizer->eos_id())));
  m.chat = std::move(chat);
  return m;
}

}  // namespace strata::bench
