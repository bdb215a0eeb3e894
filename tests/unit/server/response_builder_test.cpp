// OpenAI protocol mapping, engine outputs -> response bodies: whole responses, stream chunks,
// usage, logprobs, echo.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "openai_protocol.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::server::openai {
namespace {

using Json = nlohmann::json;

class ResponseBuilderTest : public ::testing::Test {
 protected:
  static constexpr TokenId kHi = 4, kSpace = 2, kEAcute = 7;

  static void SetUpTestSuite() {
    const Json root = {{"model",
                        {{"type", "BPE"},
                         {"vocab",
                          {{"H", 0},
                           {"i", 1},
                           {"\u0120", 2},
                           {"!", 3},
                           {"Hi", 4},
                           {"\u00c3", 5},
                           {"\u00a9", 6},
                           {"\u00c3\u00a9", 7}}},
                         {"merges", {"H i", "\u00c3 \u00a9"}}}},
                       {"normalizer", nullptr},
                       {"pre_tokenizer",
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                       {"decoder", {{"type", "ByteLevel"}}},
                       {"post_processor", nullptr},
                       {"added_tokens", Json::array()}};
    const auto dir = std::filesystem::path(::testing::TempDir()) / "openai_protocol_test";
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "tokenizer.json").string();
    std::ofstream(path) << root.dump();
    auto tokenizer = tokenizer::Tokenizer::from_tokenizer_json(path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    tokenizer_ = std::move(tokenizer).value().release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr);
    ASSERT_EQ(tokenizer_->vocab_size(), 8);
  }

  static ResponseBuilder builder(Endpoint endpoint, bool logprobs = false,
                                 bool include_usage = false) {
    ResponseBuilder::Options options;
    options.endpoint = endpoint;
    options.id = endpoint == Endpoint::kChatCompletions ? "chatcmpl-1" : "cmpl-1";
    options.model = "tiny";
    options.created = 1234;
    options.logprobs = logprobs;
    options.include_usage = include_usage;
    return ResponseBuilder(options, *tokenizer_);
  }

  static engine::RequestOutput delta(std::string text, std::vector<engine::TokenOutput> tokens = {},
                                     std::optional<engine::FinishReason> finish = std::nullopt,
                                     engine::Usage usage = {}) {
    engine::RequestOutput out;
    out.text = std::move(text);
    out.tokens = std::move(tokens);
    out.finish_reason = finish;
    out.usage = usage;
    return out;
  }

  static engine::Usage usage(int64_t prompt, int64_t cached, int64_t completion) {
    engine::Usage u;
    u.prompt_tokens = prompt;
    u.cached_prompt_tokens = cached;
    u.completion_tokens = completion;
    return u;
  }

  static std::vector<Json> parse_all(const std::vector<std::string>& chunks) {
    std::vector<Json> out;
    for (const std::string& c : chunks) {
      EXPECT_EQ(c.find('\n'), std::string::npos) << "an SSE data line must be one line: " << c;
      out.push_back(Json::parse(c));
    }
    return out;
  }

  static inline tokenizer::Tokenizer* tokenizer_ = nullptr;
};

TEST_F(ResponseBuilderTest, ChatWholeResponse) {
  ResponseBuilder b = builder(Endpoint::kChatCompletions);
  b.add(delta("Hel", {{kHi, -0.1f, {}}}, std::nullopt, usage(7, 4, 1)));
  b.add(delta("lo!", {{3, -0.2f, {}}}, engine::FinishReason::kStop, usage(7, 4, 2)));
  const Json r = Json::parse(b.response());
  EXPECT_EQ(r["id"], "chatcmpl-1");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["created"], 1234);
  EXPECT_EQ(r["model"], "tiny");
  ASSERT_EQ(r["choices"].size(), 1u);
  const Json& choice = r["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"], Json::parse(R"({"role": "assistant", "content": "Hello!"})"));
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_FALSE(choice.contains("text"));
  EXPECT_EQ(r["usage"], Json::parse(R"({"prompt_tokens": 7, "completion_tokens": 2,
      "total_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}})"));
}

TEST_F(ResponseBuilderTest, CompletionWholeResponseWithLengthFinish) {
  ResponseBuilder b = builder(Endpoint::kCompletions);
  b.add(delta("a b", {}, engine::FinishReason::kLength, usage(3, 0, 16)));
  const Json r = Json::parse(b.response());
  EXPECT_EQ(r["id"], "cmpl-1");
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "a b");
  EXPECT_FALSE(r["choices"][0].contains("message"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["total_tokens"], 19);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST_F(ResponseBuilderTest, AbortFinishReason) {
  ResponseBuilder b = builder(Endpoint::kChatCompletions);
  b.add(delta("x", {}, engine::FinishReason::kAbort));
  EXPECT_EQ(Json::parse(b.response())["choices"][0]["finish_reason"], "abort");
}

TEST_F(ResponseBuilderTest, ChatStreamRoleChunkThenDeltasThenFinish) {
  ResponseBuilder b = builder(Endpoint::kChatCompletions);
  std::vector<Json> chunks = parse_all(b.stream_chunks(delta("Hi")));
  ASSERT_EQ(chunks.size(), 2u);
  for (const Json& c : chunks) {
    EXPECT_EQ(c["id"], "chatcmpl-1");
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["created"], 1234);
    EXPECT_EQ(c["model"], "tiny");
    EXPECT_FALSE(c.contains("usage")) << "usage only with include_usage";
    ASSERT_EQ(c["choices"].size(), 1u);
    EXPECT_EQ(c["choices"][0]["index"], 0);
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  }
  EXPECT_EQ(chunks[0]["choices"][0]["delta"],
            Json::parse(R"({"role": "assistant", "content": ""})"));
  EXPECT_EQ(chunks[1]["choices"][0]["delta"], Json::parse(R"({"content": "Hi"})"));

  // Nothing visible: no chunk (and no second role chunk).
  EXPECT_TRUE(b.stream_chunks(delta("")).empty());

  chunks = parse_all(b.stream_chunks(delta(" there")));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], Json::parse(R"({"content": " there"})"));

  // The final delta without text: an empty delta carrying the finish reason.
  chunks = parse_all(b.stream_chunks(delta("", {}, engine::FinishReason::kLength)));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], Json::object());
  EXPECT_EQ(chunks[0]["choices"][0]["finish_reason"], "length");
}

TEST_F(ResponseBuilderTest, ChatStreamWithUsage) {
  ResponseBuilder b = builder(Endpoint::kChatCompletions, /*logprobs=*/false,
                              /*include_usage=*/true);
  std::vector<Json> chunks =
      parse_all(b.stream_chunks(delta("Hi", {}, engine::FinishReason::kStop)));
  ASSERT_EQ(chunks.size(), 2u);
  for (const Json& c : chunks) {
    ASSERT_TRUE(c.contains("usage"));
    EXPECT_TRUE(c["usage"].is_null());
  }
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "stop");
  const Json u = Json::parse(b.usage_chunk(usage(10, 8, 3)));
  EXPECT_EQ(u["id"], "chatcmpl-1");
  EXPECT_EQ(u["object"], "chat.completion.chunk");
  EXPECT_EQ(u["choices"], Json::array());
  EXPECT_EQ(u["usage"], Json::parse(R"({"prompt_tokens": 10, "completion_tokens": 3,
      "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 8}})"));
}

TEST_F(ResponseBuilderTest, CompletionStreamHasNoRoleChunk) {
  ResponseBuilder b = builder(Endpoint::kCompletions);
  std::vector<Json> chunks = parse_all(b.stream_chunks(delta("Once")));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["object"], "text_completion");
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "Once");
  EXPECT_TRUE(chunks[0]["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(chunks[0]["choices"][0]["finish_reason"].is_null());
  chunks = parse_all(b.stream_chunks(delta("", {}, engine::FinishReason::kStop)));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "");
  EXPECT_EQ(chunks[0]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(Json::parse(b.usage_chunk(usage(1, 0, 1)))["object"], "text_completion");
}

TEST_F(ResponseBuilderTest, ChatLogprobs) {
  ResponseBuilder b = builder(Endpoint::kChatCompletions, /*logprobs=*/true);
  const float inf = std::numeric_limits<float>::infinity();
  engine::TokenOutput t{kHi, -0.5f, {{kHi, -0.5f}, {kEAcute, -inf}}};
  std::vector<Json> chunks = parse_all(b.stream_chunks(delta("", {t})));
  // Logprobs alone make a chunk visible even without text.
  ASSERT_EQ(chunks.size(), 2u);
  const Json& lp = chunks[1]["choices"][0]["logprobs"];
  ASSERT_EQ(lp["content"].size(), 1u);
  EXPECT_TRUE(lp["refusal"].is_null());
  const Json& entry = lp["content"][0];
  EXPECT_EQ(entry["token"], "Hi");
  EXPECT_DOUBLE_EQ(entry["logprob"].get<double>(), -0.5);
  EXPECT_EQ(entry["bytes"], Json::parse("[72, 105]"));
  ASSERT_EQ(entry["top_logprobs"].size(), 2u);
  EXPECT_EQ(entry["top_logprobs"][1]["token"], "\u00e9");
  EXPECT_EQ(entry["top_logprobs"][1]["bytes"], Json::parse("[195, 169]"));
  EXPECT_EQ(entry["top_logprobs"][1]["logprob"], -9999.0);  // -inf is not JSON

  // The whole response accumulates the tokens of every delta.
  b.add(delta("Hi", {t}));
  b.add(delta(" ", {{kSpace, -1.0f, {}}}, engine::FinishReason::kStop));
  const Json r = Json::parse(b.response());
  const Json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[1]["token"], " ");
  EXPECT_EQ(content[1]["top_logprobs"], Json::array());
}

TEST_F(ResponseBuilderTest, CompletionLogprobsTextOffsetsRunAcrossChunks) {
  ResponseBuilder b = builder(Endpoint::kCompletions, /*logprobs=*/true);
  std::vector<Json> chunks =
      parse_all(b.stream_chunks(delta("Hi", {{kHi, -0.25f, {{kHi, -0.25f}, {3, -2.0f}}}})));
  ASSERT_EQ(chunks.size(), 1u);
  Json lp = chunks[0]["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json::parse(R"(["Hi"])"));
  EXPECT_EQ(lp["token_logprobs"], Json::parse("[-0.25]"));
  EXPECT_EQ(lp["top_logprobs"], Json::parse(R"([{"Hi": -0.25, "!": -2.0}])"));
  EXPECT_EQ(lp["text_offset"], Json::parse("[0]"));

  chunks =
      parse_all(b.stream_chunks(delta(" \u00e9", {{kSpace, -1.0f, {}}, {kEAcute, -1.5f, {}}})));
  ASSERT_EQ(chunks.size(), 1u);
  lp = chunks[0]["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json::parse(R"([" ", "\u00e9"])"));
  EXPECT_EQ(lp["text_offset"], Json::parse("[2, 3]"));  // characters, not bytes

  // A token id outside the tokenizer's vocabulary (the embedding table may be larger).
  chunks = parse_all(b.stream_chunks(delta("", {{500, -3.0f, {}}})));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["tokens"], Json::parse(R"([""])"));
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["text_offset"], Json::parse("[4]"));
}

// echo: the prompt's text comes first, and its tokens lead the logprobs, the first one unscored.
TEST_F(ResponseBuilderTest, CompletionEchoPrependsThePromptStreamedAndWhole) {
  auto echo_builder = [] {
    ResponseBuilder::Options options;
    options.endpoint = Endpoint::kCompletions;
    options.id = "cmpl-1";
    options.logprobs = true;
    options.echo = true;
    options.prompt_text = "Hi!";
    options.prompt_token_ids = {kHi, 3};
    return ResponseBuilder(options, *tokenizer_);
  };
  engine::RequestOutput first = delta(" \u00e9", {{kSpace, -1.0f, {}}});
  first.prompt_logprobs = {{3, -0.5f, {{kHi, -0.25f}}}};
  const Json expected_first = Json::parse(R"({
      "tokens": ["Hi", "!", " "], "token_logprobs": [null, -0.5, -1.0],
      "top_logprobs": [null, {"Hi": -0.25}, {}], "text_offset": [0, 2, 3]})");

  ResponseBuilder streamed = echo_builder();
  std::vector<Json> chunks = parse_all(streamed.stream_chunks(first));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "Hi! \u00e9");
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"], expected_first);
  chunks = parse_all(streamed.stream_chunks(
      delta("\u00e9", {{kEAcute, -2.0f, {}}}, engine::FinishReason::kLength)));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "\u00e9") << "the prompt is echoed once";
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["text_offset"], Json::parse("[4]"));

  ResponseBuilder whole = echo_builder();
  whole.add(first);
  whole.add(delta("\u00e9", {{kEAcute, -2.0f, {}}}, engine::FinishReason::kLength));
  const Json body = Json::parse(whole.response());
  EXPECT_EQ(body["choices"][0]["text"], "Hi! \u00e9\u00e9");
  EXPECT_EQ(body["choices"][0]["logprobs"]["token_logprobs"],
            Json::parse("[null, -0.5, -1.0, -2.0]"));
}

TEST_F(ResponseBuilderTest, LogprobsOffLeavesThemNull) {
  ResponseBuilder b = builder(Endpoint::kChatCompletions, /*logprobs=*/false);
  std::vector<Json> chunks = parse_all(b.stream_chunks(delta("", {{kHi, -0.5f, {}}})));
  // Only the role chunk: a token without text or logprobs shows nothing.
  ASSERT_EQ(chunks.size(), 1u);
  b.add(delta("Hi", {{kHi, -0.5f, {}}}, engine::FinishReason::kStop));
  EXPECT_TRUE(Json::parse(b.response())["choices"][0]["logprobs"].is_null());
}

}  // namespace
}  // namespace strata::server::openai
