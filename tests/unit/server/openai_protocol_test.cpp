// OpenAI protocol mapping: request bodies -> ParsedRequest (valid and invalid, table-driven),
// sampling defaults, error bodies, /v1/models. Response bodies: response_builder_test.cpp.
#include "openai_protocol.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/tokenizer/tokenizer.h"

namespace strata::server::openai {
namespace {

using Json = nlohmann::json;
constexpr int64_t kVocabSize = 1000;

StatusOr<ParsedRequest> parse(Endpoint endpoint, const Json& body) {
  return parse_request(endpoint, body.dump(), kVocabSize);
}

Json chat_body(Json extra = Json::object()) {
  Json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  body.update(extra);
  return body;
}

Json completion_body(Json extra = Json::object()) {
  Json body = {{"model", "m"}, {"prompt", "Once upon"}};
  body.update(extra);
  return body;
}

// ---- Valid requests ---------------------------------------------------------------------------

struct ValidCase {
  std::string name;
  Endpoint endpoint;
  Json body;
  std::function<void(const ParsedRequest&)> check;
};

std::vector<ValidCase> valid_cases() {
  const Endpoint chat = Endpoint::kChatCompletions;
  const Endpoint completions = Endpoint::kCompletions;
  return {
      {"ChatDefaults", chat, chat_body(),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.endpoint, Endpoint::kChatCompletions);
         EXPECT_EQ(r.model, "m");
         ASSERT_EQ(r.messages.size(), 1u);
         EXPECT_EQ(r.messages[0].role, "user");
         EXPECT_EQ(r.messages[0].content, "hi");
         EXPECT_FALSE(r.prompt_text.has_value());
         EXPECT_TRUE(r.prompt_token_ids.empty());
         const sampling::SamplingParams defaults;
         EXPECT_EQ(r.sampling.temperature, defaults.temperature);
         EXPECT_EQ(r.sampling.top_p, defaults.top_p);
         EXPECT_EQ(r.sampling.top_k, 0);
         EXPECT_EQ(r.sampling.max_tokens, defaults.max_tokens);
         EXPECT_FALSE(r.sampling.seed.has_value());
         EXPECT_TRUE(r.sampling.stop.empty());
         EXPECT_FALSE(r.max_tokens_given);
         EXPECT_FALSE(r.stream);
         EXPECT_FALSE(r.include_usage);
         EXPECT_FALSE(r.logprobs);
         EXPECT_EQ(r.sampling.num_logprobs, 0);
         EXPECT_TRUE(r.user.empty());
         EXPECT_FALSE(r.sampling.ignore_eos);
         EXPECT_TRUE(r.compress_kv);
         EXPECT_TRUE(r.kv_task.empty());
       }},
      {"SamplingFields", chat,
       chat_body({{"temperature", 0.7},
                  {"top_p", 0.9},
                  {"top_k", 40},
                  {"min_p", 0.05},
                  {"presence_penalty", 0.5},
                  {"frequency_penalty", -1.5},
                  {"repetition_penalty", 1.1},
                  {"seed", 42},
                  {"ignore_eos", true},
                  {"compress_kv", false},
                  {"kv_task", "long-document"},
                  {"user", "tenant-a"}}),
       [](const ParsedRequest& r) {
         EXPECT_DOUBLE_EQ(r.sampling.temperature, 0.7);
         EXPECT_DOUBLE_EQ(r.sampling.top_p, 0.9);
         EXPECT_EQ(r.sampling.top_k, 40);
         EXPECT_DOUBLE_EQ(r.sampling.min_p, 0.05);
         EXPECT_DOUBLE_EQ(r.sampling.presence_penalty, 0.5);
         EXPECT_DOUBLE_EQ(r.sampling.frequency_penalty, -1.5);
         EXPECT_DOUBLE_EQ(r.sampling.repetition_penalty, 1.1);
         EXPECT_EQ(r.sampling.seed, 42u);
         EXPECT_TRUE(r.sampling.ignore_eos);
         EXPECT_FALSE(r.compress_kv);
         EXPECT_EQ(r.kv_task, "long-document");
         EXPECT_EQ(r.user, "tenant-a");
       }},
      {"TemperatureZeroAndIntegerNumbers", chat, chat_body({{"temperature", 0}, {"top_p", 1}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.sampling.temperature, 0.0);
         EXPECT_EQ(r.sampling.top_p, 1.0);
       }},
      {"TopKMinusOneIsOff", chat, chat_body({{"top_k", -1}}),
       [](const ParsedRequest& r) { EXPECT_EQ(r.sampling.top_k, 0); }},
      {"HugeTopKIsClamped", chat, chat_body({{"top_k", int64_t{1} << 40}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.sampling.top_k, std::numeric_limits<int32_t>::max());
       }},
      {"HugeUnsignedSeed", chat, chat_body({{"seed", std::numeric_limits<uint64_t>::max()}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.sampling.seed, std::numeric_limits<uint64_t>::max());
       }},
      {"NullFieldsAreUnset", chat,
       chat_body({{"temperature", nullptr}, {"stop", nullptr}, {"max_tokens", nullptr}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.sampling.temperature, 1.0);
         EXPECT_TRUE(r.sampling.stop.empty());
         EXPECT_FALSE(r.max_tokens_given);
       }},
      {"StopString", chat, chat_body({{"stop", "\n\n"}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"\n\n"});
       }},
      {"StopList", completions, completion_body({{"stop", {"END", "###"}}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"END", "###"}));
       }},
      {"StopTokenIds", chat, chat_body({{"stop_token_ids", {2, 999}}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<TokenId>{2, 999}));
       }},
      {"MaxTokens", chat, chat_body({{"max_tokens", 7}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.max_tokens_given);
         EXPECT_EQ(r.sampling.max_tokens, 7);
       }},
      {"MaxCompletionTokensAlone", chat, chat_body({{"max_completion_tokens", 9}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.max_tokens_given);
         EXPECT_EQ(r.sampling.max_tokens, 9);
       }},
      {"MaxCompletionTokensWinsOverMaxTokens", chat,
       chat_body({{"max_tokens", 5}, {"max_completion_tokens", 20}}),
       [](const ParsedRequest& r) { EXPECT_EQ(r.sampling.max_tokens, 20); }},
      {"CompletionsMaxTokens", completions, completion_body({{"max_tokens", 128}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.max_tokens_given);
         EXPECT_EQ(r.sampling.max_tokens, 128);
       }},
      {"ChatLogprobsWithTop", chat, chat_body({{"logprobs", true}, {"top_logprobs", 5}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.logprobs);
         EXPECT_EQ(r.sampling.num_logprobs, 5);
       }},
      {"ChatLogprobsWithoutTop", chat, chat_body({{"logprobs", true}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.logprobs);
         EXPECT_EQ(r.sampling.num_logprobs, 0);
       }},
      {"ChatLogprobsFalse", chat, chat_body({{"logprobs", false}}),
       [](const ParsedRequest& r) { EXPECT_FALSE(r.logprobs); }},
      {"CompletionsLogprobsInteger", completions, completion_body({{"logprobs", 3}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.logprobs);
         EXPECT_EQ(r.sampling.num_logprobs, 3);
       }},
      {"CompletionsLogprobsZero", completions, completion_body({{"logprobs", 0}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.logprobs);
         EXPECT_EQ(r.sampling.num_logprobs, 0);
       }},
      {"StreamWithUsage", chat,
       chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}}}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.stream);
         EXPECT_TRUE(r.include_usage);
       }},
      {"StreamWithoutUsage", completions,
       completion_body({{"stream", true}, {"stream_options", {{"include_usage", false}}}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.stream);
         EXPECT_FALSE(r.include_usage);
       }},
      {"StreamOnly", chat, chat_body({{"stream", true}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.stream);
         EXPECT_FALSE(r.include_usage);
       }},
      {"ConversationRolesAndDeveloper", chat,
       chat_body({{"messages",
                   {{{"role", "developer"}, {"content", "rules"}},
                    {{"role", "user"}, {"content", "q"}},
                    {{"role", "assistant"}},  // no content: only called tools
                    {{"role", "user"}, {"content", "q2"}}}}}),
       [](const ParsedRequest& r) {
         ASSERT_EQ(r.messages.size(), 4u);
         EXPECT_EQ(r.messages[0].role, "system");
         EXPECT_EQ(r.messages[0].content, "rules");
         EXPECT_EQ(r.messages[2].role, "assistant");
         EXPECT_FALSE(r.messages[2].content.has_value());
         EXPECT_EQ(r.messages[3].content, "q2");
       }},
      {"ToolsToolCallsAndToolResults", chat,
       chat_body({{"messages",
                   {{{"role", "user"}, {"content", "weather?"}},
                    {{"role", "assistant"},
                     {"content", nullptr},
                     {"tool_calls",
                      {{{"id", "call_1"},
                        {"type", "function"},
                        {"function", {{"name", "get"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}},
                    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "3"}}}},
                  {"tools",
                   {{{"type", "function"},
                     {"function",
                      {{"name", "get"},
                       {"description", "Weather"},
                       {"parameters", {{"type", "object"}, {"properties", Json::object()}}}}}}}},
                  {"chat_template_kwargs", {{"enable_thinking", false}}}}),
       [](const ParsedRequest& r) {
         ASSERT_EQ(r.messages.size(), 3u);
         ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
         EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
         EXPECT_EQ(r.messages[1].tool_calls[0].name, "get");
         EXPECT_EQ(r.messages[1].tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
         EXPECT_EQ(r.messages[2].role, "tool");
         EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
         ASSERT_EQ(r.tools.size(), 1u);
         EXPECT_EQ(r.tools[0].name, "get");
         EXPECT_EQ(r.tools[0].description, "Weather");
         // Keys in the order the body has them (this test's json sorts them).
         EXPECT_EQ(r.tools[0].parameters, R"({"properties":{},"type":"object"})");
         EXPECT_TRUE(r.use_tools);
         EXPECT_EQ(r.chat_template_kwargs, R"({"enable_thinking":false})");
       }},
      {"ToolChoiceNoneKeepsToolsOut", chat,
       chat_body({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
                  {"tool_choice", "none"}}),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.tools.size(), 1u);
         EXPECT_FALSE(r.use_tools);
       }},
      {"TextContentPartsJoinedWithNewlines", chat,
       chat_body({{"messages",
                   {{{"role", "user"},
                     {"content",
                      {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}}),
       [](const ParsedRequest& r) { EXPECT_EQ(r.messages[0].content, "a\nb"); }},
      {"CompletionsTextPrompt", completions, completion_body(),
       [](const ParsedRequest& r) {
         EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
         EXPECT_EQ(r.prompt_text, "Once upon");
         EXPECT_TRUE(r.prompt_token_ids.empty());
         EXPECT_TRUE(r.messages.empty());
       }},
      {"CompletionsTokenPrompt", completions, completion_body({{"prompt", {1, 2, 3}}}),
       [](const ParsedRequest& r) {
         EXPECT_FALSE(r.prompt_text.has_value());
         EXPECT_EQ(r.prompt_token_ids, (std::vector<TokenId>{1, 2, 3}));
       }},
      {"FeaturesAtTheirOffValue", chat,
       chat_body({{"n", 1},
                  {"logit_bias", Json::object()},
                  {"tools", Json::array()},
                  {"tool_choice", "none"},
                  {"response_format", {{"type", "text"}}},
                  {"store", false},
                  {"parallel_tool_calls", true}}),
       [](const ParsedRequest& r) { EXPECT_EQ(r.messages.size(), 1u); }},
      {"CompletionsOffFeatures", completions,
       completion_body({{"best_of", 1}, {"echo", false}, {"suffix", ""}}),
       [](const ParsedRequest& r) { EXPECT_EQ(r.prompt_text, "Once upon"); }},
      {"EchoWithLogprobsScoresThePrompt", completions,
       completion_body({{"echo", true}, {"logprobs", 2}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.echo);
         EXPECT_EQ(r.sampling.prompt_logprobs, 2);
         EXPECT_EQ(r.sampling.num_logprobs, 2);
       }},
      {"EchoWithoutLogprobsScoresNothing", completions, completion_body({{"echo", true}}),
       [](const ParsedRequest& r) {
         EXPECT_TRUE(r.echo);
         EXPECT_FALSE(r.sampling.prompt_logprobs.has_value());
       }},
  };
}

class ValidRequestTest : public ::testing::TestWithParam<ValidCase> {};

TEST_P(ValidRequestTest, Parses) {
  const ValidCase& c = GetParam();
  StatusOr<ParsedRequest> parsed = parse(c.endpoint, c.body);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message() << "\nbody: " << c.body.dump();
  c.check(*parsed);
}

INSTANTIATE_TEST_SUITE_P(OpenAiProtocol, ValidRequestTest, ::testing::ValuesIn(valid_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- Invalid requests -------------------------------------------------------------------------

struct InvalidCase {
  std::string name;
  Endpoint endpoint;
  Json body;
  std::string param;  // the field the error must name
};

std::vector<InvalidCase> invalid_cases() {
  const Endpoint chat = Endpoint::kChatCompletions;
  const Endpoint completions = Endpoint::kCompletions;
  Json seventeen_stops = Json::array();
  for (int i = 0; i < 17; ++i) seventeen_stops.push_back("s" + std::to_string(i));
  Json missing_messages = chat_body();
  missing_messages.erase("messages");
  Json missing_prompt = completion_body();
  missing_prompt.erase("prompt");
  return {
      // Wrong types.
      {"TemperatureString", chat, chat_body({{"temperature", "hot"}}), "temperature"},
      {"TopPBool", chat, chat_body({{"top_p", true}}), "top_p"},
      {"TopKFloat", chat, chat_body({{"top_k", 1.5}}), "top_k"},
      {"MinPString", chat, chat_body({{"min_p", "0.1"}}), "min_p"},
      {"SeedFloat", chat, chat_body({{"seed", 1.5}}), "seed"},
      {"SeedString", completions, completion_body({{"seed", "7"}}), "seed"},
      {"StopNumber", chat, chat_body({{"stop", 5}}), "stop"},
      {"StopListWithNumber", chat, chat_body({{"stop", {"a", 5}}}), "stop[1]"},
      {"StopTokenIdsNotArray", chat, chat_body({{"stop_token_ids", 3}}), "stop_token_ids"},
      {"StopTokenIdsString", chat, chat_body({{"stop_token_ids", {"x"}}}), "stop_token_ids[0]"},
      {"MaxTokensString", chat, chat_body({{"max_tokens", "10"}}), "max_tokens"},
      {"MaxTokensFloat", completions, completion_body({{"max_tokens", 10.5}}), "max_tokens"},
      {"MaxCompletionTokensString", chat, chat_body({{"max_completion_tokens", "1"}}),
       "max_completion_tokens"},
      {"ChatLogprobsInteger", chat, chat_body({{"logprobs", 1}}), "logprobs"},
      {"CompletionsLogprobsBool", completions, completion_body({{"logprobs", true}}), "logprobs"},
      {"StreamString", chat, chat_body({{"stream", "yes"}}), "stream"},
      {"StreamOptionsNotObject", chat, chat_body({{"stream", true}, {"stream_options", true}}),
       "stream_options"},
      {"IncludeUsageString", chat,
       chat_body({{"stream", true}, {"stream_options", {{"include_usage", "yes"}}}}),
       "stream_options.include_usage"},
      {"UserNumber", chat, chat_body({{"user", 5}}), "user"},
      {"IgnoreEosInteger", chat, chat_body({{"ignore_eos", 1}}), "ignore_eos"},
      {"CompressKvString", chat, chat_body({{"compress_kv", "no"}}), "compress_kv"},
      {"KvTaskNumber", completions, completion_body({{"kv_task", 2}}), "kv_task"},
      {"ModelNumber", chat, chat_body({{"model", 3}}), "model"},
      {"StoreString", chat, chat_body({{"store", "no"}}), "store"},
      {"NString", chat, chat_body({{"n", "1"}}), "n"},
      // Out of range.
      {"TemperatureNegative", chat, chat_body({{"temperature", -1}}), "temperature"},
      {"TopPZero", chat, chat_body({{"top_p", 0}}), "top_p"},
      {"TopPAboveOne", completions, completion_body({{"top_p", 1.5}}), "top_p"},
      {"TopKBelowMinusOne", chat, chat_body({{"top_k", -2}}), "top_k"},
      {"MinPAboveOne", chat, chat_body({{"min_p", 2}}), "min_p"},
      {"PresencePenaltyTooHigh", chat, chat_body({{"presence_penalty", 2.5}}), "presence_penalty"},
      {"FrequencyPenaltyTooLow", completions, completion_body({{"frequency_penalty", -3}}),
       "frequency_penalty"},
      {"RepetitionPenaltyZero", chat, chat_body({{"repetition_penalty", 0}}), "repetition_penalty"},
      {"MaxTokensZero", chat, chat_body({{"max_tokens", 0}}), "max_tokens"},
      {"MaxCompletionTokensNegative", chat,
       chat_body({{"max_tokens", 5}, {"max_completion_tokens", -1}}), "max_completion_tokens"},
      {"MaxTokensTooBigForInt64", completions,
       completion_body({{"max_tokens", std::numeric_limits<uint64_t>::max()}}), "max_tokens"},
      {"TopLogprobsTooMany", chat, chat_body({{"logprobs", true}, {"top_logprobs", 21}}),
       "top_logprobs"},
      {"TopLogprobsNegative", chat, chat_body({{"logprobs", true}, {"top_logprobs", -1}}),
       "top_logprobs"},
      {"TopLogprobsWithoutLogprobs", chat, chat_body({{"top_logprobs", 2}}), "top_logprobs"},
      {"CompletionsLogprobsTooMany", completions, completion_body({{"logprobs", 21}}), "logprobs"},
      {"StopTokenIdOutsideVocab", chat, chat_body({{"stop_token_ids", {1, kVocabSize}}}),
       "stop_token_ids[1]"},
      {"StopTokenIdOutsideInt32", chat, chat_body({{"stop_token_ids", {int64_t{1} << 33}}}),
       "stop_token_ids[0]"},
      {"EmptyStopString", chat, chat_body({{"stop", {"ok", ""}}}), "stop[1]"},
      {"TooManyStopStrings", chat, chat_body({{"stop", seventeen_stops}}), "stop"},
      {"StreamOptionsWithoutStream", chat,
       chat_body({{"stream_options", {{"include_usage", true}}}}), "stream_options"},
      // Unsupported features.
      {"NZero", chat, chat_body({{"n", 0}}), "n"},
      {"CompletionsNTooMany", completions, completion_body({{"n", 17}}), "n"},
      {"BestOfTwo", completions, completion_body({{"best_of", 2}}), "best_of"},
      {"EchoNotABoolean", completions, completion_body({{"echo", 1}}), "echo"},
      {"Suffix", completions, completion_body({{"suffix", "end"}}), "suffix"},
      {"LogitBias", chat, chat_body({{"logit_bias", {{"5", 10}}}}), "logit_bias"},
      {"ToolWithoutFunction", chat, chat_body({{"tools", {{{"type", "function"}}}}}),
       "tools[0].function"},
      {"ToolsNotAnArray", chat, chat_body({{"tools", "f"}}), "tools"},
      {"ResponseFormatUnknown", chat, chat_body({{"response_format", {{"type", "yaml"}}}}),
       "response_format.type"},
      {"ResponseFormatSchemaMissing", chat,
       chat_body(
           {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}),
       "response_format.json_schema.schema"},
      // Unknown fields, including the other endpoint's fields.
      {"UnknownField", chat, chat_body({{"frobnicate", 1}}), "frobnicate"},
      {"ChatFieldOnCompletions", completions, completion_body({{"messages", Json::array()}}),
       "messages"},
      {"MaxCompletionTokensOnCompletions", completions,
       completion_body({{"max_completion_tokens", 5}}), "max_completion_tokens"},
      {"PromptOnChat", chat, chat_body({{"prompt", "x"}}), "prompt"},
      {"EchoOnChat", chat, chat_body({{"echo", false}}), "echo"},
      // Prompts.
      {"PromptMissing", completions, missing_prompt, "prompt"},
      {"PromptEmptyString", completions, completion_body({{"prompt", ""}}), "prompt"},
      {"PromptEmptyList", completions, completion_body({{"prompt", Json::array()}}), "prompt"},
      {"PromptListOfStrings", completions, completion_body({{"prompt", {"a", "b"}}}), "prompt"},
      {"PromptListOfTokenLists", completions, completion_body({{"prompt", {{1, 2}, {3}}}}),
       "prompt"},
      {"PromptNumber", completions, completion_body({{"prompt", 5}}), "prompt"},
      {"PromptMixedList", completions, completion_body({{"prompt", {1, "x"}}}), "prompt[1]"},
      {"PromptTokenOutsideInt32", completions, completion_body({{"prompt", {1, int64_t{1} << 40}}}),
       "prompt[1]"},
      {"PromptNegativeTokenOutsideInt32", completions,
       completion_body({{"prompt", {-(int64_t{1} << 40)}}}), "prompt[0]"},
      // Messages.
      {"MessagesMissing", chat, missing_messages, "messages"},
      {"MessagesEmpty", chat, chat_body({{"messages", Json::array()}}), "messages"},
      {"MessagesString", chat, chat_body({{"messages", "hi"}}), "messages"},
      {"MessageNotObject", chat, chat_body({{"messages", {"hi"}}}), "messages[0]"},
      {"RoleMissing", chat, chat_body({{"messages", {{{"content", "x"}}}}}), "messages[0].role"},
      {"RoleNumber", chat, chat_body({{"messages", {{{"role", 1}, {"content", "x"}}}}}),
       "messages[0].role"},
      {"ToolResultWithoutCallId", chat,
       chat_body({{"messages",
                   {{{"role", "user"}, {"content", "x"}}, {{"role", "tool"}, {"content", "y"}}}}}),
       "messages[1].tool_call_id"},
      {"ToolCallsOnAUserMessage", chat,
       chat_body(
           {{"messages", {{{"role", "user"}, {"content", "x"}, {"tool_calls", Json::array()}}}}}),
       "messages[0].tool_calls"},
      {"ToolCallArgumentsNotText", chat,
       chat_body({{"messages",
                   {{{"role", "assistant"},
                     {"tool_calls",
                      {{{"id", "c"},
                        {"type", "function"},
                        {"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}}}}}}}}),
       "messages[0].tool_calls[0].function.arguments"},
      {"ToolChoiceNamesNoTool", chat,
       chat_body({{"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}),
       "tool_choice.function.name"},
      {"ToolChoiceRequiredWithoutTools", chat, chat_body({{"tool_choice", "required"}}),
       "tool_choice"},
      {"TemplateKwargsNotAnObject", chat, chat_body({{"chat_template_kwargs", 1}}),
       "chat_template_kwargs"},
      {"RoleUnknown", chat, chat_body({{"messages", {{{"role", "robot"}, {"content", "x"}}}}}),
       "messages[0].role"},
      {"UserContentMissing", chat, chat_body({{"messages", {{{"role", "user"}}}}}),
       "messages[0].content"},
      {"ContentNumber", chat, chat_body({{"messages", {{{"role", "user"}, {"content", 5}}}}}),
       "messages[0].content"},
      {"ContentPartImage", chat,
       chat_body({{"messages",
                   {{{"role", "user"},
                     {"content",
                      {{{"type", "text"}, {"text", "look"}},
                       {{"type", "image_url"}, {"image_url", {{"url", "http://x"}}}}}}}}}}),
       "messages[0].content[1].type"},
      {"ContentPartWithoutType", chat,
       chat_body({{"messages", {{{"role", "user"}, {"content", {{{"text", "a"}}}}}}}}),
       "messages[0].content[0].type"},
      {"ContentPartNotObject", chat,
       chat_body({{"messages", {{{"role", "user"}, {"content", {"a"}}}}}}),
       "messages[0].content[0]"},
      {"ContentPartTextNumber", chat,
       chat_body(
           {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", 1}}}}}}}}),
       "messages[0].content[0].text"},
  };
}

class InvalidRequestTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidRequestTest, NamesTheField) {
  const InvalidCase& c = GetParam();
  StatusOr<ParsedRequest> parsed = parse(c.endpoint, c.body);
  ASSERT_FALSE(parsed.ok()) << "accepted: " << c.body.dump();
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(field_of_message(parsed.status().message()), c.param)
      << "message: " << parsed.status().message();
}

INSTANTIATE_TEST_SUITE_P(OpenAiProtocol, InvalidRequestTest, ::testing::ValuesIn(invalid_cases()),
                         [](const auto& info) { return info.param.name; });

// A parse error quotes a short excerpt of the body, not the body (which may be megabytes).
TEST(ParseRequestTest, ParseErrorsQuoteAnExcerpt) {
  const std::string body = "{\"messages\": \"" + std::string(1 << 20, 'a');
  StatusOr<ParsedRequest> r = parse_request(Endpoint::kChatCompletions, body, kVocabSize);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_LT(r.status().message().size(), 400u) << r.status().message().size();
}

// A number no double can hold is the client's error, naming its field.
TEST(ParseRequestTest, NumberOverflowIsA400NamingTheField) {
  for (const char* field : {"temperature", "max_tokens", "seed"}) {
    const std::string body = std::string(R"({"prompt": "x", ")") + field + R"(": 1e400})";
    StatusOr<ParsedRequest> r = parse_request(Endpoint::kCompletions, body, kVocabSize);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(field_of_message(r.status().message()), std::optional<std::string>(field))
        << r.status().message();
  }
}

// Fields the body leaves unset take the deployment's defaults; fields it sets win.
TEST(ParseRequestTest, UnsetSamplingFieldsTakeTheDefaults) {
  sampling::SamplingParams defaults;
  defaults.temperature = 0.8;
  defaults.top_k = 40;
  defaults.top_p = 0.95;
  defaults.min_p = 0.05;
  StatusOr<ParsedRequest> r = parse_request(
      Endpoint::kChatCompletions, chat_body({{"top_p", 0.5}}).dump(), kVocabSize, defaults);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.temperature, 0.8);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.top_p, 0.5);
  EXPECT_EQ(r->sampling.min_p, 0.05);
  r = parse_request(Endpoint::kCompletions, completion_body({{"temperature", 0}}).dump(),
                    kVocabSize, defaults);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sampling.temperature, 0.0);
  EXPECT_EQ(r->sampling.top_k, 40);
  // Without defaults, OpenAI's.
  r = parse_request(Endpoint::kCompletions, completion_body().dump(), kVocabSize);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sampling.temperature, 1.0);
  EXPECT_EQ(r->sampling.top_k, 0);
}

TEST(ParseRequestTest, MalformedJsonAndNonObjectBodies) {
  for (const char* body : {"{not json", "", "[1, 2]", "\"text\"", "null"}) {
    StatusOr<ParsedRequest> parsed =
        parse_request(Endpoint::kChatCompletions, body, kVocabSize);
    ASSERT_FALSE(parsed.ok()) << body;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(field_of_message(parsed.status().message()), std::nullopt)
        << parsed.status().message();
  }
}

TEST(ParseRequestTest, StopTokenIdsAreCheckedAgainstTheGivenVocabulary) {
  const std::string body = chat_body({{"stop_token_ids", {50}}}).dump();
  EXPECT_TRUE(parse_request(Endpoint::kChatCompletions, body, 51).ok());
  EXPECT_FALSE(parse_request(Endpoint::kChatCompletions, body, 50).ok());
}

TEST(FieldOfMessageTest, ExtractsTheLeadingField) {
  EXPECT_EQ(field_of_message("temperature must be >= 0, got -1"), "temperature");
  EXPECT_EQ(field_of_message("messages[0].role: 'x' is not system"), "messages[0].role");
  EXPECT_EQ(field_of_message("stop_token_ids[3] must be in [0, 5)"), "stop_token_ids[3]");
  EXPECT_EQ(field_of_message("We could not parse the JSON body"), std::nullopt);
  EXPECT_EQ(field_of_message("temperature"), std::nullopt);
  EXPECT_EQ(field_of_message(""), std::nullopt);
  EXPECT_EQ(field_of_message(": nothing before"), std::nullopt);
}

// ---- Responses --------------------------------------------------------------------------------

TEST(ErrorBodyTest, AllFieldsWithNullsWhenUnset) {
  ApiError error;
  error.http_status = 400;
  error.message = "top_p must be in (0, 1], got 2";
  error.type = "invalid_request_error";
  error.param = "top_p";
  Json body = Json::parse(error_body(error));
  EXPECT_EQ(body, Json::parse(R"({"error": {"message": "top_p must be in (0, 1], got 2",
      "type": "invalid_request_error", "param": "top_p", "code": null}})"));
  error.param.reset();
  error.code = "model_not_found";
  body = Json::parse(error_body(error));
  EXPECT_TRUE(body["error"]["param"].is_null());
  EXPECT_EQ(body["error"]["code"], "model_not_found");
}

TEST(ModelBodyTest, ListAndSingle) {
  const Json model = Json::parse(model_body("tiny", 1700000000, 2048));
  EXPECT_EQ(model["id"], "tiny");
  EXPECT_EQ(model["object"], "model");
  EXPECT_EQ(model["created"], 1700000000);
  EXPECT_EQ(model["max_model_len"], 2048);
  const Json list = Json::parse(model_list_body("tiny", 1700000000, 2048));
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0], model);
}

TEST(FinishReasonTest, Strings) {
  EXPECT_STREQ(finish_reason_string(engine::FinishReason::kStop), "stop");
  EXPECT_STREQ(finish_reason_string(engine::FinishReason::kLength), "length");
  EXPECT_STREQ(finish_reason_string(engine::FinishReason::kAbort), "abort");
  EXPECT_STREQ(finish_reason_string(engine::FinishReason::kError), "error");
}

// A tiny byte-level BPE vocabulary: "H", "i", " ", "!", "Hi", the two bytes of "é" and "é".
}  // namespace
}  // namespace strata::server::openai
