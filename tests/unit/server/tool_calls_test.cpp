// Tool calls in model output: the format each real template teaches, the parsers per family
// (examples written as the models write them), the streaming hold-back, and the OpenAI response
// and stream chunks that carry the calls.
#include "tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "openai_protocol.h"
#include "strata/model/gguf_file.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::server {
namespace {

using Json = nlohmann::json;

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/tests/data/chat_templates/" + name +
                   ".jinja");
  EXPECT_TRUE(in.good()) << name;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ToolCallFormatTest, FromTheRealTemplates) {
  const std::pair<const char*, ToolCallFormat> cases[] = {
      {"Qwen-Qwen2.5-7B-Instruct", ToolCallFormat::kHermes},
      {"Qwen-Qwen3-0.6B", ToolCallFormat::kHermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolCallFormat::kHermes},
      {"HuggingFaceTB-SmolLM3-3B", ToolCallFormat::kNone},  // tools only via its xml_tools
      {"meta-llama-Llama-3.1-8B-Instruct", ToolCallFormat::kLlama3Json},
      {"meta-llama-Llama-3.2-3B-Instruct", ToolCallFormat::kLlama3Json},
      {"mistralai-Mistral-Nemo-Instruct-2407", ToolCallFormat::kMistral},
      {"Mistral-Small-3.2-24B-Instruct-2506", ToolCallFormat::kMistral},
      {"google-gemma-2-2b-it", ToolCallFormat::kNone},
      {"meta-llama-Llama-2-7b-chat-hf", ToolCallFormat::kNone},
  };
  for (const auto& [name, format] : cases) {
    EXPECT_EQ(tool_call_format(read_template(name)), format) << name;
  }
}

TEST(ParseToolCallsTest, Hermes) {
  ParsedReply r = parse_tool_calls(
      ToolCallFormat::kHermes,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": "
      "\"a </tool_call> in a string\"}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(r.calls[0].arguments), Json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(r.calls[1].name, "search");
  // A reply cut at the stop token, without the closing tag, still counts.
  r = parse_tool_calls(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  // Markup that is not a call stays content, as the model wrote it.
  const std::string broken = "<tool_call>{\"name\": oops}</tool_call> done";
  r = parse_tool_calls(ToolCallFormat::kHermes, broken);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, broken);
  r = parse_tool_calls(ToolCallFormat::kHermes, "plain answer");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "plain answer");
}

TEST(ParseToolCallsTest, Llama3Json) {
  ParsedReply r = parse_tool_calls(
      ToolCallFormat::kLlama3Json,
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; "
      "{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(r.calls[0].arguments), Json::parse(R"({"city": "Rome"})"));
  r = parse_tool_calls(ToolCallFormat::kLlama3Json,
                       " {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": 1}");
  // Prose, or JSON that is not a call, is content.
  for (const char* text :
       {"The weather is fine.", "{\"answer\": 42}", "{\"name\": \"f\"} and more"}) {
    r = parse_tool_calls(ToolCallFormat::kLlama3Json, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ParseToolCallsTest, Mistral) {
  ParsedReply r = parse_tool_calls(
      ToolCallFormat::kMistral,
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, "
      "{\"name\": \"search\", \"arguments\": {\"query\": \"y\"}}]");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.content, "");
  r = parse_tool_calls(ToolCallFormat::kMistral,
                       "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}"
                       "[TOOL_CALLS]search[ARGS]{\"query\": \"z\"}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Sure.");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(r.calls[1].arguments), Json::parse(R"({"query": "z"})"));
  r = parse_tool_calls(ToolCallFormat::kMistral, "[TOOL_CALLS] [not json");
  EXPECT_TRUE(r.calls.empty());
}

TEST(StreamablePrefixTest, HoldsBackMarkersAndTheirPrefixes) {
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "Hello"), 5u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "Hello <tool"), 6u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "Hi<tool_call>{"), 2u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "a < b"), 5u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kMistral, "x[TOOL_"), 1u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3Json, "  "), 0u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3Json, "{\"na"), 0u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3Json, "<|python"), 0u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3Json, "The answer"), 10u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kNone, "<tool_call>"), 11u);
}

TEST(ToolCallIdTest, Shapes) {
  const std::string id = new_tool_call_id(ToolCallFormat::kHermes);
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(id.size(), 29u);
  EXPECT_NE(id, new_tool_call_id(ToolCallFormat::kHermes));
  const std::string mistral = new_tool_call_id(ToolCallFormat::kMistral);
  EXPECT_EQ(mistral.size(), 9u);  // Mistral's templates require exactly 9 alphanumerics
  for (char c : mistral) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)));
}

class ToolResponseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = model::GgufFile::open(STRATA_TEST_MODEL);
    ASSERT_TRUE(file.ok());
    auto tok = tokenizer::Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.ok());
    tokenizer_ = std::move(tok).value().release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  static openai::ResponseBuilder builder(ToolCallFormat format) {
    openai::ResponseBuilder::Options options;
    options.endpoint = openai::Endpoint::kChatCompletions;
    options.id = "chatcmpl-1";
    options.model = "m";
    options.tool_format = format;
    return openai::ResponseBuilder(options, *tokenizer_);
  }

  static engine::RequestOutput delta(std::string text, bool last = false) {
    engine::RequestOutput out;
    out.text = std::move(text);
    if (last) out.finish_reason = engine::FinishReason::kStop;
    return out;
  }

  static inline tokenizer::Tokenizer* tokenizer_ = nullptr;
};

TEST_F(ToolResponseTest, WholeResponseCarriesToolCalls) {
  openai::ResponseBuilder b = builder(ToolCallFormat::kHermes);
  b.add(delta("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"));
  b.add(delta("</tool_call>", true));
  const Json body = Json::parse(b.response());
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_FALSE(call.contains("index"));

  openai::ResponseBuilder plain = builder(ToolCallFormat::kHermes);
  plain.add(delta("It is sunny.", true));
  const Json text = Json::parse(plain.response());
  EXPECT_EQ(text["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(text["choices"][0]["message"]["content"], "It is sunny.");
  EXPECT_FALSE(text["choices"][0]["message"].contains("tool_calls"));
}

TEST_F(ToolResponseTest, StreamSendsContentThenOneDeltaPerCall) {
  openai::ResponseBuilder b = builder(ToolCallFormat::kHermes);
  std::string content;
  std::vector<Json> calls;
  Json finish;
  for (const char* piece :
       {"Checking", " now <tool", "_call>{\"name\": \"a\", \"arguments\": {}}",
        "</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}", "</tool_call>"}) {
    for (const std::string& chunk : b.stream_chunks(delta(piece))) {
      const Json c = Json::parse(chunk);
      const Json& d = c["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      EXPECT_FALSE(d.contains("tool_calls")) << "calls go out when the reply ends";
    }
  }
  EXPECT_EQ(content, "Checking now ");
  for (const std::string& chunk : b.stream_chunks(delta("", true))) {
    const Json c = Json::parse(chunk);
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) calls.push_back(d["tool_calls"][0]);
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, "Checking now ");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[1]["index"], 1);
  EXPECT_EQ(calls[1]["function"]["name"], "b");
  EXPECT_EQ(finish, "tool_calls");
}

TEST_F(ToolResponseTest, StreamReleasesHeldTextThatWasNoCall) {
  openai::ResponseBuilder b = builder(ToolCallFormat::kLlama3Json);
  std::string content;
  for (const char* piece : {"{\"answer\"", ": 42}"}) {
    for (const std::string& chunk : b.stream_chunks(delta(piece))) {
      const Json d = Json::parse(chunk)["choices"][0]["delta"];
      EXPECT_TRUE(!d.contains("content") || d.contains("role")) << "held back: " << chunk;
    }
  }
  for (const std::string& chunk : b.stream_chunks(delta("", true))) {
    const Json c = Json::parse(chunk);
    if (c["choices"][0]["delta"].contains("content")) {
      content += c["choices"][0]["delta"]["content"].get<std::string>();
    }
    if (!c["choices"][0]["finish_reason"].is_null()) {
      EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
    }
  }
  EXPECT_EQ(content, "{\"answer\": 42}");
}

}  // namespace
}  // namespace strata::server
