#include "openai_protocol.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "chat_request.h"
#include "json_fields.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::server::openai {
namespace {

// Error messages quote at most this many bytes of what the client sent.
constexpr size_t kMaxErrorExcerpt = 200;

// Logprobs of impossible tokens are -inf, which JSON cannot carry; vLLM sends this instead.
constexpr double kMinLogprob = -9999.0;

std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// ---- Request parsing --------------------------------------------------------------------------

// Request fields each endpoint understands. Anything else is rejected, as OpenAI does.
const std::set<std::string>& known_fields(Endpoint endpoint) {
  static const std::set<std::string> kChat = {"model",
                                              "messages",
                                              "max_tokens",
                                              "max_completion_tokens",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "min_p",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "repetition_penalty",
                                              "seed",
                                              "stop",
                                              "stop_token_ids",
                                              "n",
                                              "logprobs",
                                              "top_logprobs",
                                              "stream",
                                              "stream_options",
                                              "user",
                                              "ignore_eos",
                                              "compress_kv",
                                              "kv_task",
                                              "logit_bias",
                                              "tools",
                                              "tool_choice",
                                              "parallel_tool_calls",
                                              "response_format",
                                              "chat_template_kwargs",
                                              "store",
                                              "metadata",
                                              "service_tier"};
  static const std::set<std::string> kCompletions = {"model",
                                                     "prompt",
                                                     "max_tokens",
                                                     "temperature",
                                                     "top_p",
                                                     "top_k",
                                                     "min_p",
                                                     "presence_penalty",
                                                     "frequency_penalty",
                                                     "repetition_penalty",
                                                     "seed",
                                                     "stop",
                                                     "stop_token_ids",
                                                     "n",
                                                     "logprobs",
                                                     "stream",
                                                     "stream_options",
                                                     "user",
                                                     "ignore_eos",
                                                     "compress_kv",
                                                     "kv_task",
                                                     "logit_bias",
                                                     "echo",
                                                     "best_of",
                                                     "suffix"};
  return endpoint == Endpoint::kChatCompletions ? kChat : kCompletions;
}

// Fields we accept only at their "off" value (features we do not implement).
Status check_unsupported(const Json& root) {
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, integer_field(root, "best_of"));
  if (best_of && *best_of != 1) return field_error("best_of", "only best_of = 1 is supported");
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> suffix, string_field(root, "suffix"));
  if (suffix && !suffix->empty()) return field_error("suffix", "is not supported");
  if (const Json* v = find_field(root, "logit_bias")) {
    if (!v->is_object()) return type_error("logit_bias", "an object", *v);
    if (!v->empty()) return field_error("logit_bias", "is not supported");
  }
  return Status::ok_status();
}

// "stop": a string or a list of strings.
StatusOr<std::vector<std::string>> parse_stop(const Json& root) {
  std::vector<std::string> stop;
  const Json* v = find_field(root, "stop");
  if (v == nullptr) return stop;
  if (v->is_string()) {
    stop.push_back(v->get<std::string>());
    return stop;
  }
  if (!v->is_array()) return type_error("stop", "a string or an array of strings", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& s = (*v)[i];
    if (!s.is_string()) return type_error("stop[" + std::to_string(i) + "]", "a string", s);
    stop.push_back(s.get<std::string>());
  }
  return stop;
}

StatusOr<std::vector<TokenId>> parse_token_ids(const Json& array, const std::string& field) {
  std::vector<TokenId> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    const Json& t = array[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (!t.is_number_integer()) return type_error(at, "a token id (integer)", t);
    if (t.is_number_unsigned() ? t.get<uint64_t>() > std::numeric_limits<TokenId>::max()
                               : (t.get<int64_t>() < std::numeric_limits<TokenId>::min() ||
                                  t.get<int64_t>() > std::numeric_limits<TokenId>::max())) {
      return field_error(at, "token id " + t.dump() + " is outside the vocabulary");
    }
    ids.push_back(static_cast<TokenId>(t.get<int64_t>()));
  }
  return ids;
}

Status parse_sampling(const Json& root, Endpoint endpoint, ParsedRequest* out) {
  sampling::SamplingParams& s = out->sampling;
  STRATA_ASSIGN_OR_RETURN(std::optional<double> temperature, number_field(root, "temperature"));
  if (temperature) s.temperature = *temperature;
  STRATA_ASSIGN_OR_RETURN(std::optional<double> top_p, number_field(root, "top_p"));
  if (top_p) s.top_p = *top_p;
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, integer_field(root, "top_k"));
  if (top_k) {
    // -1 means "off" in vLLM's API; values past the vocabulary keep everything anyway.
    if (*top_k < -1) return field_error("top_k", "must be >= 0 (0 or -1 = off)");
    s.top_k = *top_k == -1 ? 0 : static_cast<int32_t>(std::min<int64_t>(*top_k, INT32_MAX));
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<double> min_p, number_field(root, "min_p"));
  if (min_p) s.min_p = *min_p;
  STRATA_ASSIGN_OR_RETURN(std::optional<double> presence, number_field(root, "presence_penalty"));
  if (presence) s.presence_penalty = *presence;
  STRATA_ASSIGN_OR_RETURN(std::optional<double> frequency, number_field(root, "frequency_penalty"));
  if (frequency) s.frequency_penalty = *frequency;
  STRATA_ASSIGN_OR_RETURN(std::optional<double> repetition,
                          number_field(root, "repetition_penalty"));
  if (repetition) s.repetition_penalty = *repetition;
  if (const Json* seed = find_field(root, "seed")) {
    if (!seed->is_number_integer()) return type_error("seed", "an integer", *seed);
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                        : static_cast<uint64_t>(seed->get<int64_t>());
  }
  STRATA_ASSIGN_OR_RETURN(s.stop, parse_stop(root));
  if (const Json* ids = find_field(root, "stop_token_ids")) {
    if (!ids->is_array()) return type_error("stop_token_ids", "an array of token ids", *ids);
    STRATA_ASSIGN_OR_RETURN(s.stop_token_ids, parse_token_ids(*ids, "stop_token_ids"));
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, bool_field(root, "ignore_eos"));
  s.ignore_eos = ignore_eos.value_or(false);

  // max_completion_tokens is chat's newer name for max_tokens; it wins when both are given.
  std::string max_tokens_field = "max_tokens";
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, integer_field(root, "max_tokens"));
  if (endpoint == Endpoint::kChatCompletions) {
    STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> max_completion,
                            integer_field(root, "max_completion_tokens"));
    if (max_completion) {
      max_tokens = max_completion;
      max_tokens_field = "max_completion_tokens";
    }
  }
  if (max_tokens) {
    if (*max_tokens < 1) {
      return field_error(max_tokens_field, "must be >= 1, got " + std::to_string(*max_tokens));
    }
    s.max_tokens = *max_tokens;
    out->max_tokens_given = true;
  }

  if (endpoint == Endpoint::kChatCompletions) {
    STRATA_ASSIGN_OR_RETURN(std::optional<bool> logprobs, bool_field(root, "logprobs"));
    STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> top, integer_field(root, "top_logprobs"));
    out->logprobs = logprobs.value_or(false);
    if (top && !out->logprobs) return field_error("top_logprobs", "requires logprobs: true");
    if (top && (*top < 0 || *top > sampling::kMaxNumLogprobs)) {
      return field_error("top_logprobs", "must be in [0, 20], got " + std::to_string(*top));
    }
    s.num_logprobs = static_cast<int32_t>(top.value_or(0));
  } else {
    STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, integer_field(root, "logprobs"));
    if (logprobs && (*logprobs < 0 || *logprobs > sampling::kMaxNumLogprobs)) {
      return field_error("logprobs", "must be in [0, 20], got " + std::to_string(*logprobs));
    }
    out->logprobs = logprobs.has_value();
    s.num_logprobs = static_cast<int32_t>(logprobs.value_or(0));
    STRATA_ASSIGN_OR_RETURN(std::optional<bool> echo, bool_field(root, "echo"));
    out->echo = echo.value_or(false);
    // Echoed with logprobs, the prompt is scored as well (loglikelihood, perplexity).
    if (out->echo && out->logprobs) s.prompt_logprobs = s.num_logprobs;
  }
  return Status::ok_status();
}

Status parse_prompt(const Json& root, ParsedRequest* out) {
  const Json* prompt = find_field(root, "prompt");
  if (prompt == nullptr) return field_error("prompt", "is required");
  if (prompt->is_string()) {
    if (prompt->get_ref<const std::string&>().empty()) {
      return field_error("prompt", "must not be empty");
    }
    out->prompt_text = prompt->get<std::string>();
    return Status::ok_status();
  }
  if (!prompt->is_array()) {
    return type_error("prompt", "a string or an array of token ids", *prompt);
  }
  if (prompt->empty()) return field_error("prompt", "must not be empty");
  if (!(*prompt)[0].is_number()) {
    return field_error("prompt", "a list of prompts is not supported: send one prompt per request");
  }
  STRATA_ASSIGN_OR_RETURN(out->prompt_token_ids, parse_token_ids(*prompt, "prompt"));
  return Status::ok_status();
}

// The engine validates SamplingParams with its own field names; say the request's instead.
Status rename_field(Status status, std::string_view from, std::string_view to) {
  const std::string& m = status.message();
  if (status.ok() || from == to || !m.starts_with(from) || m.size() == from.size()) return status;
  const char next = m[from.size()];
  if (next != ' ' && next != ':' && next != '[') return status;
  return Status(status.code(), std::string(to) + m.substr(from.size()));
}

// ---- Responses --------------------------------------------------------------------------------

Json usage_json(const engine::Usage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", Json{{"cached_tokens", usage.cached_prompt_tokens}}}};
}

double finite_logprob(float logprob) {
  return std::isfinite(logprob) ? static_cast<double>(logprob) : kMinLogprob;
}

// Characters (UTF-8 code points) in `text`.
int64_t num_chars(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

std::string error_body(const ApiError& error) {
  Json body = {{"message", error.message},
               {"type", error.type},
               {"param", error.param ? Json(*error.param) : Json(nullptr)},
               {"code", error.code ? Json(*error.code) : Json(nullptr)}};
  return dump(Json{{"error", body}});
}

std::optional<std::string> field_of_message(std::string_view message) {
  size_t end = 0;
  while (end < message.size() &&
         (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '_' ||
          message[end] == '.' || message[end] == '[' || message[end] == ']')) {
    ++end;
  }
  if (end == 0 || end == message.size()) return std::nullopt;
  const std::string_view rest = message.substr(end);
  if (rest.starts_with(":") || rest.starts_with(" must"))
    return std::string(message.substr(0, end));
  return std::nullopt;
}

// The error for a number that overflows: names the key the number follows in `body` (the parser
// quotes the number as '...' in `what`), or the body when there is none.
Status number_overflow_error(std::string_view body, const std::string& what) {
  const size_t open = what.find('\'');
  const size_t close = what.rfind('\'');
  const std::string number =
      open != std::string::npos && close > open ? what.substr(open + 1, close - open - 1) : "";
  std::string field = "body";
  if (const size_t at = number.empty() ? std::string_view::npos : body.find(number);
      at != std::string_view::npos) {
    // Back over whitespace and ':' to the closing quote of the key.
    size_t end = at;
    while (end > 0 &&
           (std::isspace(static_cast<unsigned char>(body[end - 1])) != 0 || body[end - 1] == ':')) {
      --end;
    }
    if (end > 0 && body[end - 1] == '"') {
      const size_t begin = body.rfind('"', end - 2);
      if (begin != std::string_view::npos)
        field = std::string(body.substr(begin + 1, end - begin - 2));
    }
  }
  std::string shown = number.substr(0, kMaxErrorExcerpt);
  return field_error(field.substr(0, kMaxErrorExcerpt),
                     "the number " + shown + " is out of range for a double");
}

StatusOr<ParsedRequest> parse_request(Endpoint endpoint, std::string_view body, int64_t vocab_size,
                                      const sampling::SamplingParams& defaults) {
  Json root;
  try {
    root = Json::parse(body);
  } catch (const Json::out_of_range& e) {
    // A number JSON allows but a double cannot hold (1e400): a 400 naming the field.
    return number_overflow_error(body, e.what());
  } catch (const Json::parse_error& e) {
    // The parser quotes the last token it read, which may be most of the body: keep an excerpt.
    std::string what = e.what();
    if (what.size() > kMaxErrorExcerpt) what = what.substr(0, kMaxErrorExcerpt) + "...";
    return invalid_argument_error("We could not parse the JSON body of your request (" + what +
                                  ")");
  }
  if (!root.is_object()) {
    return invalid_argument_error(std::string("The request body must be a JSON object, got ") +
                                  root.type_name());
  }
  const std::set<std::string>& known = known_fields(endpoint);
  for (const auto& [key, value] : root.items()) {
    if (!known.contains(key)) {
      return field_error(key, "Unrecognized request argument supplied");
    }
  }
  STRATA_RETURN_IF_ERROR(check_unsupported(root));

  ParsedRequest out;
  out.endpoint = endpoint;
  out.sampling = defaults;
  STRATA_ASSIGN_OR_RETURN(out.model, string_field(root, "model"));
  STRATA_ASSIGN_OR_RETURN(std::optional<int64_t> n, integer_field(root, "n"));
  if (n && (*n < 1 || *n > kMaxChoices)) {
    return field_error(
        "n", "must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(*n));
  }
  out.n = static_cast<int32_t>(n.value_or(1));
  if (endpoint == Endpoint::kChatCompletions) {
    STRATA_RETURN_IF_ERROR(parse_chat_fields(root, &out));
  } else {
    STRATA_RETURN_IF_ERROR(parse_prompt(root, &out));
  }
  STRATA_RETURN_IF_ERROR(parse_sampling(root, endpoint, &out));

  STRATA_ASSIGN_OR_RETURN(std::optional<bool> compress_kv, bool_field(root, "compress_kv"));
  out.compress_kv = compress_kv.value_or(true);
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> kv_task, string_field(root, "kv_task"));
  out.kv_task = kv_task.value_or("");
  STRATA_ASSIGN_OR_RETURN(std::optional<bool> stream, bool_field(root, "stream"));
  out.stream = stream.value_or(false);
  if (const Json* options = find_field(root, "stream_options")) {
    if (!out.stream) return field_error("stream_options", "is only allowed when stream is true");
    if (!options->is_object()) return type_error("stream_options", "an object", *options);
    const Json* include_usage = find_field(*options, "include_usage");
    if (include_usage != nullptr && !include_usage->is_boolean()) {
      return type_error("stream_options.include_usage", "a boolean", *include_usage);
    }
    out.include_usage = include_usage != nullptr && include_usage->get<bool>();
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> user, string_field(root, "user"));
  out.user = user.value_or("");
  // Metadata fields that change nothing here: checked for type only.
  STRATA_RETURN_IF_ERROR(bool_field(root, "store").status());
  STRATA_RETURN_IF_ERROR(bool_field(root, "parallel_tool_calls").status());

  // max_tokens was checked above under the name the request used.
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const Status valid = rename_field(out.sampling.validate(vocab_size), "num_logprobs",
                                    chat ? "top_logprobs" : "logprobs");
  STRATA_RETURN_IF_ERROR(rename_field(valid, "prompt_logprobs", "logprobs"));
  return out;
}

namespace {

Json model_json(const std::string& served_name, int64_t created, int64_t max_context_tokens) {
  return Json{{"id", served_name},
              {"object", "model"},
              {"created", created},
              {"owned_by", "strata"},
              {"max_model_len", max_context_tokens}};
}

}  // namespace

Endpoint lookup_endpoint(std::string_view body) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("messages") ? Endpoint::kChatCompletions
                                                 : Endpoint::kCompletions;
}

std::string kv_lookup_body(int64_t prompt_tokens, int64_t stored_tokens, const std::string& tier) {
  return dump(Json{{"object", "kv.lookup"},
                   {"prompt_tokens", prompt_tokens},
                   {"stored_tokens", stored_tokens},
                   {"tier", tier.empty() ? Json(nullptr) : Json(tier)}});
}

std::string model_list_body(const std::string& served_name, int64_t created,
                            int64_t max_context_tokens) {
  return dump(Json{{"object", "list"},
                   {"data", Json::array({model_json(served_name, created, max_context_tokens)})}});
}

std::string model_body(const std::string& served_name, int64_t created,
                       int64_t max_context_tokens) {
  return dump(model_json(served_name, created, max_context_tokens));
}

const char* finish_reason_string(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop: return "stop";
    case engine::FinishReason::kLength: return "length";
    case engine::FinishReason::kAbort: return "abort";
    case engine::FinishReason::kError: return "error";
  }
  return "error";
}

ResponseBuilder::ResponseBuilder(Options options, const tokenizer::Tokenizer& tokenizer)
    : options_(std::move(options)), tokenizer_(tokenizer) {}

namespace {

// Text and raw bytes of one token for logprobs; empty for ids outside the tokenizer's vocabulary
// (the model's embedding table may be larger).
struct TokenText {
  std::string text;
  Json bytes = Json::array();
};

TokenText token_text(const tokenizer::Tokenizer& tokenizer, TokenId id) {
  TokenText t;
  if (id < 0 || id >= tokenizer.vocab_size()) return t;
  t.text = tokenizer.decode(std::span<const TokenId>(&id, 1), /*skip_special=*/false);
  for (unsigned char c : tokenizer.token_bytes(id)) t.bytes.push_back(static_cast<int>(c));
  return t;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.
Json chat_logprobs(const tokenizer::Tokenizer& tokenizer,
                   std::span<const engine::TokenOutput> tokens) {
  Json content = Json::array();
  for (const engine::TokenOutput& t : tokens) {
    TokenText text = token_text(tokenizer, t.token);
    Json top = Json::array();
    for (const sampling::TokenLogprob& alt : t.top_logprobs) {
      TokenText alt_text = token_text(tokenizer, alt.token);
      top.push_back({{"token", std::move(alt_text.text)},
                     {"logprob", finite_logprob(alt.logprob)},
                     {"bytes", std::move(alt_text.bytes)}});
    }
    content.push_back({{"token", std::move(text.text)},
                       {"logprob", finite_logprob(t.logprob)},
                       {"bytes", std::move(text.bytes)},
                       {"top_logprobs", std::move(top)}});
  }
  return Json{{"content", std::move(content)}, {"refusal", nullptr}};
}

}  // namespace

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"},
// built token by token; `text_offset` counts characters across calls. An echoed prompt's first
// token has null for its logprob and its alternatives (nothing comes before it).
class CompletionLogprobs {
 public:
  CompletionLogprobs(const tokenizer::Tokenizer& tokenizer, int64_t* text_offset)
      : tokenizer_(tokenizer), text_offset_(text_offset) {}

  void add_unscored(TokenId token) { add_entry(token, nullptr, nullptr); }
  void add(std::span<const engine::TokenOutput> tokens) {
    for (const engine::TokenOutput& t : tokens) {
      Json top = Json::object();
      for (const sampling::TokenLogprob& alt : t.top_logprobs) {
        top[token_text(tokenizer_, alt.token).text] = finite_logprob(alt.logprob);
      }
      add_entry(t.token, finite_logprob(t.logprob), std::move(top));
    }
  }
  Json take() {
    return Json{{"tokens", std::move(strings_)},
                {"token_logprobs", std::move(logprobs_)},
                {"top_logprobs", std::move(tops_)},
                {"text_offset", std::move(offsets_)}};
  }

 private:
  void add_entry(TokenId token, Json logprob, Json top) {
    std::string text = token_text(tokenizer_, token).text;
    offsets_.push_back(*text_offset_);
    *text_offset_ += num_chars(text);
    strings_.push_back(std::move(text));
    logprobs_.push_back(std::move(logprob));
    tops_.push_back(std::move(top));
  }

  const tokenizer::Tokenizer& tokenizer_;
  int64_t* text_offset_;
  Json strings_ = Json::array(), logprobs_ = Json::array(), tops_ = Json::array(),
       offsets_ = Json::array();
};

namespace {

Json finish_json(const std::optional<engine::FinishReason>& reason, bool called_tools = false) {
  if (reason && called_tools && *reason == engine::FinishReason::kStop) return Json("tool_calls");
  return reason ? Json(finish_reason_string(*reason)) : Json(nullptr);
}

Json tool_calls_json(const std::vector<ParsedToolCall>& calls, ToolCallFormat format,
                     bool with_index) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json call = {{"id", new_tool_call_id(format)},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) call["index"] = i;
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

std::vector<std::string> ResponseBuilder::stream_chunks(const engine::RequestOutput& delta) {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  auto chunk = [&](Json choice) {
    Json c = {{"id", options_.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", options_.created},
              {"model", options_.model},
              {"choices", Json::array({std::move(choice)})}};
    if (options_.include_usage) c["usage"] = nullptr;
    return dump(c);
  };
  std::vector<std::string> chunks;
  if (chat && !sent_role_) {
    chunks.push_back(chunk({{"index", options_.choice_index},
                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                            {"logprobs", nullptr},
                            {"finish_reason", nullptr}}));
    sent_role_ = true;
  }
  // An echoed prompt goes out with the first delta, before its text.
  const bool echo_now = options_.echo && !echoed_;
  echoed_ = true;
  const std::string text = echo_now ? options_.prompt_text + delta.text : delta.text;
  const bool has_logprobs = options_.logprobs && (echo_now || !delta.tokens.empty());
  if (text.empty() && !has_logprobs && !delta.finish_reason) return chunks;
  Json logprobs = nullptr;
  if (has_logprobs && chat) {
    logprobs = chat_logprobs(tokenizer_, delta.tokens);
  } else if (has_logprobs) {
    CompletionLogprobs completion(tokenizer_, &text_offset_);
    if (echo_now) add_echoed_prompt(completion, delta.prompt_logprobs);
    completion.add(delta.tokens);
    logprobs = completion.take();
  }
  if (chat) {
    ParsedReply tail;
    const std::string content = options_.tool_format == ToolCallFormat::kNone
                                    ? delta.text
                                    : tool_stream_content(delta, &tail);
    Json message = Json::object();
    if (!content.empty()) message["content"] = content;
    if (!tail.calls.empty()) {
      // The calls follow the content, one chunk each, and the finish reason with the last.
      chunks.push_back(chunk({{"index", options_.choice_index},
                              {"delta", std::move(message)},
                              {"logprobs", std::move(logprobs)},
                              {"finish_reason", nullptr}}));
      const Json calls = tool_calls_json(tail.calls, options_.tool_format, true);
      for (size_t i = 0; i < calls.size(); ++i) {
        const bool last = i + 1 == calls.size();
        chunks.push_back(chunk(
            {{"index", options_.choice_index},
             {"delta", {{"tool_calls", Json::array({calls[i]})}}},
             {"logprobs", nullptr},
             {"finish_reason", last ? finish_json(delta.finish_reason, true) : Json(nullptr)}}));
      }
      return chunks;
    }
    chunks.push_back(chunk({{"index", options_.choice_index},
                            {"delta", std::move(message)},
                            {"logprobs", std::move(logprobs)},
                            {"finish_reason", finish_json(delta.finish_reason)}}));
  } else {
    chunks.push_back(chunk({{"index", options_.choice_index},
                            {"text", text},
                            {"logprobs", std::move(logprobs)},
                            {"finish_reason", finish_json(delta.finish_reason)}}));
  }
  return chunks;
}

std::string ResponseBuilder::tool_stream_content(const engine::RequestOutput& delta,
                                                 ParsedReply* calls) {
  reply_ += delta.text;
  if (!delta.finish_reason) {
    const size_t ready = std::max(streamed_, streamable_prefix(options_.tool_format, reply_));
    std::string content = reply_.substr(streamed_, ready - streamed_);
    streamed_ = ready;
    return content;
  }
  const std::string_view rest = std::string_view(reply_).substr(streamed_);
  streamed_ = reply_.size();
  *calls = parse_tool_calls(options_.tool_format, rest);
  if (calls->calls.empty()) return std::string(rest);
  return calls->content;
}

std::string merge_choices(const std::vector<std::string>& bodies) {
  Json merged = Json::parse(bodies.front());
  int64_t completion = 0;
  for (size_t i = 0; i < bodies.size(); ++i) {
    const Json body = i == 0 ? merged : Json::parse(bodies[i]);
    if (i > 0) merged["choices"].push_back(body["choices"][0]);
    completion += body["usage"]["completion_tokens"].get<int64_t>();
  }
  merged["usage"]["completion_tokens"] = completion;
  merged["usage"]["total_tokens"] = merged["usage"]["prompt_tokens"].get<int64_t>() + completion;
  return dump(merged);
}

std::string ResponseBuilder::usage_chunk(const engine::Usage& usage) const {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  return dump(Json{{"id", options_.id},
                   {"object", chat ? "chat.completion.chunk" : "text_completion"},
                   {"created", options_.created},
                   {"model", options_.model},
                   {"choices", Json::array()},
                   {"usage", usage_json(usage)}});
}

void ResponseBuilder::add_echoed_prompt(
    CompletionLogprobs& logprobs, std::span<const engine::TokenOutput> prompt_logprobs) const {
  if (!options_.prompt_token_ids.empty()) logprobs.add_unscored(options_.prompt_token_ids[0]);
  logprobs.add(prompt_logprobs);
}

void ResponseBuilder::add(const engine::RequestOutput& delta) {
  text_ += delta.text;
  prompt_logprobs_.insert(prompt_logprobs_.end(), delta.prompt_logprobs.begin(),
                          delta.prompt_logprobs.end());
  if (options_.logprobs) tokens_.insert(tokens_.end(), delta.tokens.begin(), delta.tokens.end());
  if (delta.finish_reason) finish_reason_ = delta.finish_reason;
  usage_ = delta.usage;
}

std::string ResponseBuilder::response() const {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  Json logprobs = nullptr;
  if (options_.logprobs && chat) {
    logprobs = chat_logprobs(tokenizer_, tokens_);
  } else if (options_.logprobs) {
    int64_t text_offset = 0;
    CompletionLogprobs completion(tokenizer_, &text_offset);
    if (options_.echo) add_echoed_prompt(completion, prompt_logprobs_);
    completion.add(tokens_);
    logprobs = completion.take();
  }
  Json choice = {{"index", options_.choice_index},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_json(finish_reason_)}};
  if (chat) {
    const ParsedReply reply = parse_tool_calls(options_.tool_format, text_);
    choice["message"] = {{"role", "assistant"}, {"content", reply.content}};
    if (!reply.calls.empty()) {
      if (reply.content.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] = tool_calls_json(reply.calls, options_.tool_format, false);
      choice["finish_reason"] = finish_json(finish_reason_, true);
    }
  } else {
    choice["text"] = options_.echo ? options_.prompt_text + text_ : text_;
  }
  return dump(Json{{"id", options_.id},
                   {"object", chat ? "chat.completion" : "text_completion"},
                   {"created", options_.created},
                   {"model", options_.model},
                   {"choices", Json::array({std::move(choice)})},
                   {"usage", usage_json(usage_)}});
}

}  // namespace strata::server::openai
