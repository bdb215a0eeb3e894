// Private to the HTTP server: OpenAI's JSON request and response bodies <-> engine types, for
// /v1/chat/completions and /v1/completions. No I/O and no HTTP here; nlohmann::json stays inside
// the .cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/engine/engine.h"
#include "strata/sampling/sampling_params.h"
#include "strata/tokenizer/chat_template.h"
#include "tool_calls.h"

namespace strata::tokenizer {
class Tokenizer;
}

namespace strata::server::openai {

class CompletionLogprobs;

enum class Endpoint { kChatCompletions, kCompletions };

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;                  // "invalid_request_error", "server_error", ...
  std::optional<std::string> param;  // the offending request field, e.g. "messages[0].role"
  std::optional<std::string> code;   // e.g. "model_not_found", "context_length_exceeded"
};
std::string error_body(const ApiError& error);

// The field a validation message is about: messages in this code base start with the field name,
// followed by ':' or " must" ("temperature must be >= 0, got -1", "messages[0].role: ...").
std::optional<std::string> field_of_message(std::string_view message);

// A validated request body. The prompt is not tokenized yet.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::optional<std::string> model;
  int32_t n = 1;  // choices: samples of the one prompt (Engine::submit_parallel)
  std::vector<tokenizer::ChatMessage> messages;  // kChatCompletions: non-empty
  std::vector<tokenizer::ToolDefinition> tools;
  bool use_tools = false;            // tools given and tool_choice not "none": render and parse
  // tool_choice "required" (any of `tools`) or a function's name: the reply must call it.
  std::optional<std::string> forced_tool;  // "" = any tool
  std::string chat_template_kwargs;  // JSON object text, or empty
  // response_format: kText, or the JSON the reply must be (schema text for kJsonSchema).
  enum class Format { kText, kJsonObject, kJsonSchema } format = Format::kText;
  std::string json_schema;
  // kCompletions: exactly one of the two is set (non-empty).
  std::optional<std::string> prompt_text;
  std::vector<TokenId> prompt_token_ids;
  // Fully set except max_tokens when !max_tokens_given (its default depends on the prompt length).
  sampling::SamplingParams sampling;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // return per-token logprobs (sampling.num_logprobs alternatives)
  // kCompletions: return the prompt before the completion; with logprobs the prompt is scored too
  // (sampling.prompt_logprobs is set), as OpenAI's legacy echo does.
  bool echo = false;
  std::string user;            // the tenant for prefix-cache isolation; may be empty
  bool compress_kv = true;     // Strata's extension: false keeps the request's KV uncompressed
  std::string kv_task;         // Strata's extension: the task family of its stored KV (AdaptCache)
};

// Parses and validates a request body, sampling parameters included (against `vocab_size`).
// INVALID_ARGUMENT whose message starts with the request field at fault (see field_of_message),
// for malformed JSON, wrong types, out-of-range values, unknown fields and unsupported features
// (n > 1, a list of prompts, non-text content parts, ...). Sampling fields the body leaves unset
// take their value from `defaults`.
StatusOr<ParsedRequest> parse_request(Endpoint endpoint, std::string_view body, int64_t vocab_size,
                                      const sampling::SamplingParams& defaults = {});

// POST /v1/kv/lookup takes a chat completion or a completion body: the one it is (kChatCompletions
// when it has "messages"; anything unparsable is left to parse_request to name).
Endpoint lookup_endpoint(std::string_view body);
// Its answer: the request's prompt tokens, how many of them this replica's KV store holds, and
// the farthest tier they would be loaded from (null when none).
std::string kv_lookup_body(int64_t prompt_tokens, int64_t stored_tokens, const std::string& tier);

// GET /v1/models (a list of one) and /v1/models/{model}: the served model.
std::string model_list_body(const std::string& served_name, int64_t created,
                            int64_t max_context_tokens);
std::string model_body(const std::string& served_name, int64_t created, int64_t max_context_tokens);

// "stop", "length", "abort" ("error" for kError, which callers report as an error instead).
const char* finish_reason_string(engine::FinishReason reason);

// At most this many choices per request (n).
inline constexpr int64_t kMaxChoices = 16;

// One whole response out of the n single-choice ones of the same request: their choices in
// order, the prompt counted once and the completion tokens summed.
std::string merge_choices(const std::vector<std::string>& bodies);

// The response bodies of one request: stream chunks or the whole response. Token strings for
// logprobs are decoded with `tokenizer`, which must outlive the builder. Not thread-safe.
class ResponseBuilder {
 public:
  struct Options {
    Endpoint endpoint = Endpoint::kCompletions;
    std::string id;       // "chatcmpl-..." / "cmpl-..."
    std::string model;    // the served name
    int64_t created = 0;  // Unix seconds
    bool logprobs = false;
    bool include_usage = false;  // stream: every chunk has "usage": null, then a usage chunk
    // kCompletions echo: the prompt's text and tokens come first in the text and the logprobs
    // (its first token unscored, the rest from the engine's prompt_logprobs).
    bool echo = false;
    std::string prompt_text;
    std::vector<TokenId> prompt_token_ids;
    // kChatCompletions with tools: the reply's tool calls in this format become "tool_calls"
    // (streamed as one delta per call once the reply ends; content before them streams as usual).
    ToolCallFormat tool_format = ToolCallFormat::kNone;
    int32_t choice_index = 0;  // n > 1: this choice's "index"
  };
  ResponseBuilder(Options options, const tokenizer::Tokenizer& tokenizer);

  // Stream: the JSON chunks (without the SSE framing) for one delta; may be empty when the delta
  // carries nothing a client sees. The first call also yields chat's role chunk.
  std::vector<std::string> stream_chunks(const engine::RequestOutput& delta);
  // Stream: the trailing chunk with no choices and the usage (only with include_usage).
  std::string usage_chunk(const engine::Usage& usage) const;

  // Whole response: accumulate every delta, then build the body once the final one was added.
  void add(const engine::RequestOutput& delta);
  std::string response() const;

 private:
  void add_echoed_prompt(CompletionLogprobs& logprobs,
                         std::span<const engine::TokenOutput> prompt_logprobs) const;
  // Stream with tools: the content of `delta` that can go out now, and at the end the rest of
  // the reply split into content and calls (*calls).
  std::string tool_stream_content(const engine::RequestOutput& delta, ParsedReply* calls);

  Options options_;
  const tokenizer::Tokenizer& tokenizer_;
  bool sent_role_ = false;
  bool echoed_ = false;
  int64_t text_offset_ = 0;  // kCompletions logprobs: characters of text so far
  std::string reply_;        // stream with tools: the reply so far
  size_t streamed_ = 0;      // ... and how many of its bytes went out as content
  // Accumulated by add().
  std::string text_;
  std::vector<engine::TokenOutput> tokens_;
  std::vector<engine::TokenOutput> prompt_logprobs_;
  std::optional<engine::FinishReason> finish_reason_;
  engine::Usage usage_;
};

}  // namespace strata::server::openai
