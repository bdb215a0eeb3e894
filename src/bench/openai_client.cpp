// OpenAI-compatible streaming client (completions and chat completions over server-sent events),
// plus the helpers of stream_timing.h that read HTTP endpoints.

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "client_internal.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::bench {

namespace {

using Json = nlohmann::json;

std::unique_ptr<httplib::Client> http_client(const std::string& origin, double timeout_s) {
  auto client = std::make_unique<httplib::Client>(origin);
  const auto timeout = std::chrono::duration<double>(timeout_s);
  client->set_connection_timeout(std::chrono::seconds(10));
  client->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client->set_write_timeout(std::chrono::seconds(60));
  return client;
}

std::string describe_error(httplib::Error error) {
  if (error == httplib::Error::Connection) return "connection failed (is the server running?)";
  return httplib::to_string(error);
}

std::string http_error(const std::string& what, const httplib::Result& result) {
  if (!result) return what + ": " + describe_error(result.error());
  return what + ": HTTP " + std::to_string(result->status) + " " + result->body.substr(0, 300);
}

class OpenAiClient final : public BenchClient {
 public:
  OpenAiClient(const ClientOptions& options, HttpUrl url, const tokenizer::Tokenizer& tokenizer)
      : options_(options), url_(std::move(url)), tokenizer_(tokenizer),
        chat_(options.backend == "openai-chat") {
    if (options_.endpoint.empty()) {
      options_.endpoint = chat_ ? "/v1/chat/completions" : "/v1/completions";
    }
    if (options_.metrics_url.empty()) options_.metrics_url = options_.base_url + "/metrics";
  }

  std::string describe() const override {
    return options_.backend + " " + url_.origin + url_.path_prefix + options_.endpoint;
  }
  std::string model_id() const override { return options_.model; }

  Status probe() override {
    auto client = http_client(url_.origin, 10);
    httplib::Result result = client->Get(url_.path_prefix + "/v1/models", headers());
    if (!result || result->status != 200) {
      return Status(StatusCode::kUnavailable,
                    http_error("cannot reach an OpenAI-compatible server at " + url_.origin +
                                   url_.path_prefix + "/v1/models",
                               result));
    }
    if (options_.model.empty()) {
      Json models = Json::parse(result->body, nullptr, false);
      if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() ||
          models["data"].empty() || !models["data"][0].contains("id")) {
        return Status(StatusCode::kUnavailable,
                      url_.origin + "/v1/models lists no model; pass --model");
      }
      options_.model = models["data"][0]["id"].get<std::string>();
    }
    return Status();
  }

  RequestResult send(const BenchRequest& request, bool ignore_eos) override {
    RequestResult result;
    result.prompt_len = request.prompt_len;
    Json body = {{"model", options_.model},
                 {"max_tokens", request.max_tokens},
                 {"temperature", options_.temperature},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (ignore_eos) body["ignore_eos"] = true;
    if (!request.kv_task.empty()) body["kv_task"] = request.kv_task;
    if (chat_) {
      Json messages = Json::array();
      if (request.messages.empty()) messages.push_back({{"role", "user"}, {"content", request.prompt}});
      for (const Message& m : request.messages) {
        messages.push_back({{"role", m.role}, {"content", m.content}});
      }
      body["messages"] = std::move(messages);
    } else {
      if (!request.messages.empty()) {
        result.error = "the openai (completions) backend cannot send chat messages; use "
                       "--backend openai-chat";
        return result;
      }
      body["prompt"] = request.prompt;
    }

    httplib::Request http;
    http.method = "POST";
    http.path = url_.path_prefix + options_.endpoint;
    http.headers = headers();
    http.set_header("Content-Type", "application/json");
    http.body = body.dump();
    int status = 0;
    std::string pending;   // SSE bytes not yet split into events
    std::string raw_body;  // kept for error messages
    StreamTiming timing;
    std::optional<int64_t> usage_tokens;
    http.response_handler = [&](const httplib::Response& response) {
      status = response.status;
      return true;
    };
    http.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      if (status != 200) {
        raw_body.append(data, size);
        return true;
      }
      pending.append(data, size);
      size_t end;
      while ((end = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, end);
        pending.erase(0, end + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.starts_with("data:")) continue;
        std::string payload = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
        // Some servers end without [DONE]; the connection closing ends the stream either way.
        if (payload == "[DONE]") continue;
        Json event = Json::parse(payload, nullptr, false);
        if (event.is_discarded()) {
          result.error = "malformed stream event: " + payload.substr(0, 200);
          return false;
        }
        if (event.contains("error")) {
          result.error = "server error: " + event["error"].dump();
          return false;
        }
        if (event.contains("usage") && event["usage"].is_object()) read_usage(event["usage"], result, usage_tokens);
        if (event.contains("choices") && event["choices"].is_array() && !event["choices"].empty()) {
          const Json& choice = event["choices"][0];
          std::string text;
          if (chat_) {
            if (choice.contains("delta") && choice["delta"].contains("content") &&
                choice["delta"]["content"].is_string()) {
              text = choice["delta"]["content"].get<std::string>();
            }
          } else if (choice.contains("text") && choice["text"].is_string()) {
            text = choice["text"].get<std::string>();
          }
          // A chat stream's first event often carries only the role: not a generated token.
          if (!text.empty() || timing.first_seen()) timing.on_chunk(text, result);
        }
      }
      return true;
    };
    auto client = http_client(url_.origin, options_.request_timeout_s);
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    const bool sent = client->send(http, response, error);
    timing.finish(result);
    if (!result.error.empty()) return result;
    if (!sent) {
      result.error = "request failed: " + describe_error(error);
    } else if (status != 200) {
      result.error = "HTTP " + std::to_string(status) + ": " + raw_body.substr(0, 300);
    } else if (!timing.first_seen()) {
      result.error = "the stream ended without generated text (the server stopped at once)";
    } else {
      result.success = true;
      result.output_len = usage_tokens ? *usage_tokens
                                       : static_cast<int64_t>(
                                             tokenizer_.encode(result.generated_text, false).size());
    }
    return result;
  }

  StatusOr<std::vector<double>> score(const std::vector<TokenId>& prompt_token_ids,
                                      int64_t decode_tokens) override {
    if (decode_tokens > 0) {
      return unimplemented_error("scoring by decoding (--decode-tokens) runs in process only");
    }
    // OpenAI's legacy scoring request: the prompt echoed back with its tokens' logprobs (the
    // first one null); the one generated token after it is not part of the score.
    const Json body = {{"model", options_.model},
                       {"prompt", prompt_token_ids},
                       {"max_tokens", 1},
                       {"temperature", 0},
                       {"echo", true},
                       {"logprobs", 0}};
    auto client = http_client(url_.origin, options_.request_timeout_s);
    httplib::Result response = client->Post(url_.path_prefix + "/v1/completions", headers(),
                                            body.dump(), "application/json");
    if (!response)
      return internal_error("scoring request failed: " + describe_error(response.error()));
    if (response->status != 200) {
      return internal_error("scoring request: HTTP " + std::to_string(response->status) + ": " +
                            response->body.substr(0, 300));
    }
    const Json answer = Json::parse(response->body, nullptr, false);
    const Json* logprobs = nullptr;
    if (!answer.is_discarded() && answer.contains("choices") && answer["choices"].is_array() &&
        !answer["choices"].empty() && answer["choices"][0].contains("logprobs") &&
        answer["choices"][0]["logprobs"].is_object() &&
        answer["choices"][0]["logprobs"].contains("token_logprobs")) {
      logprobs = &answer["choices"][0]["logprobs"]["token_logprobs"];
    }
    if (logprobs == nullptr || !logprobs->is_array() ||
        logprobs->size() < prompt_token_ids.size()) {
      return internal_error(
          "the server did not echo the prompt's logprobs (it needs "
          "/v1/completions with echo and logprobs): " +
          response->body.substr(0, 300));
    }
    std::vector<double> out;
    for (size_t i = 1; i < prompt_token_ids.size(); ++i) {
      if (!(*logprobs)[i].is_number()) {
        return internal_error("prompt token " + std::to_string(i) + " has no logprob");
      }
      out.push_back((*logprobs)[i].get<double>());
    }
    return out;
  }

  std::optional<TierTokens> tier_hit_tokens() override {
    return scrape_tier_hit_tokens(options_.metrics_url);
  }
  std::optional<Counters> store_counters() override {
    return scrape_store_counters(options_.metrics_url);
  }

 private:
  httplib::Headers headers() const {
    httplib::Headers headers;
    if (!options_.api_key.empty()) headers.emplace("Authorization", "Bearer " + options_.api_key);
    return headers;
  }

  static void read_usage(const Json& usage, RequestResult& result,
                         std::optional<int64_t>& usage_tokens) {
    if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer()) {
      usage_tokens = usage["completion_tokens"].get<int64_t>();
    }
    if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer()) {
      result.server_prompt_tokens = usage["prompt_tokens"].get<int64_t>();
    }
    if (usage.contains("prompt_tokens_details") && usage["prompt_tokens_details"].is_object() &&
        usage["prompt_tokens_details"].contains("cached_tokens") &&
        usage["prompt_tokens_details"]["cached_tokens"].is_number_integer()) {
      result.cached_prompt_tokens = usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    }
  }

  ClientOptions options_;
  const HttpUrl url_;
  const tokenizer::Tokenizer& tokenizer_;
  const bool chat_;
};

}  // namespace

StatusOr<HttpUrl> parse_http_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos ||
      (url.compare(0, scheme_end, "http") != 0 && url.compare(0, scheme_end, "https") != 0)) {
    return invalid_argument_error("expected an http:// or https:// URL, got \"" + url + "\"");
  }
  const size_t path_start = url.find('/', scheme_end + 3);
  HttpUrl out;
  out.origin = url.substr(0, path_start);
  if (out.origin.size() == scheme_end + 3) {
    return invalid_argument_error("the URL \"" + url + "\" has no host");
  }
  if (path_start != std::string::npos) out.path_prefix = url.substr(path_start);
  while (!out.path_prefix.empty() && out.path_prefix.back() == '/') out.path_prefix.pop_back();
  return out;
}

namespace {

// The samples of the Prometheus text at `url`: {"name{labels}", value}; nullopt if unreadable.
std::optional<Counters> scrape_samples(const std::string& url) {
  StatusOr<HttpUrl> parsed = parse_http_url(url);
  if (!parsed.ok()) return std::nullopt;
  auto client = http_client(parsed->origin, 10);
  httplib::Result result = client->Get(parsed->path_prefix.empty() ? "/" : parsed->path_prefix);
  if (!result || result->status != 200) return std::nullopt;
  Counters samples;
  std::istringstream lines(result->body);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t value_start = line.rfind(' ');
    if (line.empty() || line[0] == '#' || value_start == std::string::npos) continue;
    samples[line.substr(0, value_start)] = std::strtod(line.c_str() + value_start + 1, nullptr);
  }
  return samples;
}

}  // namespace

std::optional<TierTokens> scrape_tier_hit_tokens(const std::string& url) {
  const std::optional<Counters> samples = scrape_samples(url);
  if (!samples) return std::nullopt;
  // Samples like: strata_kv_tier_hit_tokens_total{tier="dram"} 1234
  const std::string family = "strata_kv_tier_hit_tokens_total{tier=\"";
  TierTokens tokens;
  for (const auto& [key, value] : *samples) {
    if (key.starts_with(family) && key.ends_with("\"}")) {
      tokens[key.substr(family.size(), key.size() - family.size() - 2)] = value;
    }
  }
  if (tokens.empty()) return std::nullopt;
  return tokens;
}

std::optional<Counters> scrape_store_counters(const std::string& url) {
  const std::optional<Counters> samples = scrape_samples(url);
  if (!samples) return std::nullopt;
  Counters counters;
  for (const char* name : kStoreCounterNames) {
    const std::string family = std::string(name) == "preemptions"
                                   ? "strata_preemptions_total"
                                   : "strata_kv_store_" + std::string(name) + "_total";
    if (auto it = samples->find(family); it != samples->end()) counters[name] = it->second;
  }
  if (counters.empty()) return std::nullopt;
  return counters;
}

std::unique_ptr<BenchClient> make_openai_client(const ClientOptions& options, HttpUrl url,
                                                const tokenizer::Tokenizer& tokenizer) {
  return std::make_unique<OpenAiClient>(options, std::move(url), tokenizer);
}

}  // namespace strata::bench
