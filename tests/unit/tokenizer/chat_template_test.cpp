// Chat rendering against transformers' Jinja output (tests/reference/tokenizer_reference.py), plus
// family detection, default system prompts and errors.
#include "strata/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/model/gguf_file.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::tokenizer {
namespace {

using nlohmann::json;

std::vector<ChatMessage> messages_of(const json& list) {
  std::vector<ChatMessage> out;
  for (const json& m : list)
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

TEST(ChatTemplateReferenceTest, RendersLikeTransformers) {
  const std::string path = std::string(STRATA_TEST_DATA_DIR) + "/tokenizer/chat_cases.json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing " << path;
  std::ostringstream contents;
  contents << in.rdbuf();
  const json root = json::parse(contents.str());
  size_t num_cases = 0;
  for (const json& t : root["templates"]) {
    const std::string name = t["name"].get<std::string>();
    auto chat = ChatTemplate::from_source(t["source"].get<std::string>(), std::nullopt);
    ASSERT_TRUE(chat.ok()) << name << ": " << chat.status().to_string();
    EXPECT_STREQ(chat_template_kind_name(chat->kind()), t["kind"].get<std::string>().c_str())
        << name;
    const std::optional<std::string> want_system =
        t["default_system"].is_null() ? std::nullopt
                                      : std::optional(t["default_system"].get<std::string>());
    EXPECT_EQ(chat->default_system_prompt(), want_system) << name;
    EXPECT_EQ(chat->encode_add_bos(), name == "chatml_bos") << name;
    // Where the template writes bos_token but we leave it to encode(add_bos = true), the BOS text
    // is what is missing from our rendering.
    const std::string bos_text = chat->encode_add_bos() ? t["bos"].get<std::string>() : "";
    for (const json& c : t["cases"]) {
      ++num_cases;
      const auto messages = messages_of(c["messages"]);
      const auto rendered = chat->render(messages, c["add_generation_prompt"].get<bool>());
      if (c.contains("error")) {
        EXPECT_FALSE(rendered.ok())
            << name << ": transformers raised " << c["error"] << " for " << c["messages"].dump();
        if (!rendered.ok()) {
          EXPECT_EQ(rendered.status().code(), StatusCode::kInvalidArgument);
        }
      } else {
        ASSERT_TRUE(rendered.ok()) << name << ": " << rendered.status().to_string();
        EXPECT_EQ(bos_text + *rendered, c["rendered"].get<std::string>())
            << name << " messages " << c["messages"].dump() << " add_generation_prompt "
            << c["add_generation_prompt"];
      }
    }
  }
  EXPECT_GE(num_cases, 100u);
}

TEST(ChatTemplateTest, DefaultModelTemplateIsChatMLWithSmolLMSystemPrompt) {
  auto file = model::GgufFile::open(STRATA_TEST_MODEL);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto tokenizer = Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  auto chat = ChatTemplate::from_source((*tokenizer)->chat_template_source(), std::nullopt);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->kind(), ChatTemplateKind::kChatML);
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  auto prompt = chat->render(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const auto ids = (*tokenizer)->encode(*prompt, /*add_bos=*/false);
  EXPECT_FALSE(chat->encode_add_bos());
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>
  EXPECT_EQ((*tokenizer)->decode(ids, /*skip_special=*/false), *prompt);
}

TEST(ChatTemplateTest, DetectionAndFallback) {
  auto unknown = ChatTemplate::from_source("{{ messages[0]['content'] }}", std::nullopt);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  auto empty = ChatTemplate::from_source("", std::nullopt);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  auto fallback = ChatTemplate::from_source("", ChatTemplateKind::kLlama3);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->kind(), ChatTemplateKind::kLlama3);
  // Llama 2 uses [INST] too, but with <<SYS>> blocks Mistral's rendering would be wrong.
  auto llama2 = ChatTemplate::from_source(
      "{{ bos_token + '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}", std::nullopt);
  EXPECT_FALSE(llama2.ok());
  auto mistral = ChatTemplate::from_source("{{ '[INST] ' + m + ' [/INST]' }}", std::nullopt);
  ASSERT_TRUE(mistral.ok());
  EXPECT_EQ(mistral->kind(), ChatTemplateKind::kMistral);
}

TEST(ChatTemplateTest, DefaultSystemPromptExtraction) {
  // Escaped quote inside the literal, and a preceding literal that splices in content.
  auto chat = ChatTemplate::from_source(
      "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
      "{{ '<|im_start|>system\\nIt\\'s me.\\tHi<|im_end|>\\n' }}",
      std::nullopt);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->default_system_prompt(), std::optional<std::string>("It's me.\tHi"));
  auto plain = ChatTemplate::from_source("{{ '<|im_start|>' + role + '\\n' }}", std::nullopt);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->default_system_prompt(), std::nullopt);
  // With a system message first, the default is not inserted.
  const std::vector<ChatMessage> messages = {{"system", "S"}, {"user", "U"}};
  EXPECT_EQ(*chat->render(messages, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTemplateTest, EmptyConversationIsRejected) {
  for (auto kind :
       {ChatTemplateKind::kChatML, ChatTemplateKind::kLlama3, ChatTemplateKind::kMistral}) {
    auto rendered = ChatTemplate(kind).render({}, true);
    EXPECT_EQ(rendered.status().code(), StatusCode::kInvalidArgument)
        << chat_template_kind_name(kind);
  }
}

}  // namespace
}  // namespace strata::tokenizer
