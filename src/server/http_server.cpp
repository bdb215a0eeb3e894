#include "strata/server/http_server.h"

#include <httplib.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <thread>

#include "api_keys.h"
#include "http_connections.h"
#include "request_ids.h"
#include "metrics.h"
#include "openai_protocol.h"
#include "strata/model/model_config.h"
#include "strata/server/tenant.h"
#include "strata/tokenizer/tokenizer.h"
#include "structured_outputs.h"

namespace strata::server {
namespace {

using Clock = std::chrono::steady_clock;
using openai::ApiError;
using openai::Endpoint;

// How often a request thread waiting for tokens checks its client and the shutdown deadline.
constexpr std::chrono::milliseconds kPollInterval{50};
// OpenAI's default max_tokens for /v1/completions; chat defaults to the rest of the context.
constexpr int64_t kDefaultCompletionMaxTokens = 16;
// nginx's "client closed request": recorded in /metrics for requests whose client went away.
constexpr int kClientClosedRequest = 499;

// ---- Errors -----------------------------------------------------------------------------------

// The one place a Status becomes an HTTP status.
int http_status(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kCancelled: return kClientClosedRequest;
    case StatusCode::kUnimplemented: return 501;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal: return 500;
  }
  return 500;
}

ApiError make_error(int status, std::string message, std::optional<std::string> param = {},
                    std::optional<std::string> code = {}) {
  return {status, std::move(message), status < 500 ? "invalid_request_error" : "server_error",
          std::move(param), std::move(code)};
}

// `param` is the field the message starts with, if any (see openai::field_of_message).
ApiError api_error(const Status& status, std::optional<std::string> code = {}) {
  return make_error(http_status(status.code()), status.message(),
                    openai::field_of_message(status.message()), std::move(code));
}

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(openai::error_body(error), "application/json");
}

// ---- The client's connection --------------------------------------------------------------------

// Whether the client closed (or reset) the connection. A client that sends a request and then
// shuts down only its sending side counts as gone too; HTTP clients do not do that.
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

// ---- The service --------------------------------------------------------------------------------

// One generation request between submit() and its final delta.
struct InFlight {
  std::shared_ptr<engine::RequestStream> stream;
  std::optional<int> socket;  // the client's connection, to notice it going away
  Clock::time_point received;
  std::optional<Clock::time_point> timeout_at;  // HttpServerOptions::request_timeout
  std::optional<Clock::time_point> last_token;
  bool cancelled = false;  // by the shutdown deadline or the request timeout
  bool timed_out = false;  // ... by the request timeout
};

// One choice of a request: its sequence's stream and the bodies built from it.
struct Choice {
  InFlight request;
  openai::ResponseBuilder builder;
};

// A streamed response, shared by httplib's content provider and its releaser. With n > 1 the
// choices are relayed one after the other (each chunk names its choice's index).
struct StreamState {
  std::vector<Choice> choices;
  bool include_usage = false;
  bool done = false;  // the provider ran to its end (the request is finished or cancelled)
};

class Service {
 public:
  Service(engine::Engine& engine, std::optional<tokenizer::ChatTemplate> chat,
          const HttpServerOptions& options)
      : engine_(engine),
        chat_(std::move(chat)),
        options_(options),
        structured_(engine.tokenizer()),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()) {}

  void install(httplib::Server& server) {
    server.Post("/v1/chat/completions",
                with_body([this](const auto& req, const std::string& body, auto& res) {
                  generate(Endpoint::kChatCompletions, req, body, res);
                }));
    server.Post("/v1/completions",
                with_body([this](const auto& req, const std::string& body, auto& res) {
                  generate(Endpoint::kCompletions, req, body, res);
                }));
    server.Post("/v1/kv/lookup",
                with_body([this](const auto& req, const std::string& body, auto& res) {
                  lookup(req, body, res);
                }));
    server.Get("/v1/models", guarded([this](const auto& req, auto& res) { models(req, res); }));
    server.Get(R"(/v1/models/(.+))",
               guarded([this](const auto& req, auto& res) { model(req, res); }));
    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(health_body(engine_.executor().kernel_report()), "application/json");
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.render(engine_.stats()) +
                          render_kernel_metrics(engine_.executor().kernel_report()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    // Responses httplib produced without a body: unknown paths, oversized or malformed requests.
    using HandlerResponse = httplib::Server::HandlerResponse;
    server.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) -> HandlerResponse {
          if (!res.body.empty() || res.content_provider_) return HandlerResponse::Unhandled;
          if (res.status == 404) {
            send_error(res, make_error(404, "Invalid URL (" + req.method + " " + req.path + ")"));
          } else if (res.status == 413) {
            send_error(res, body_too_large());
          } else {
            send_error(res,
                       make_error(res.status, "Bad request (" + std::to_string(res.status) + ")"));
          }
          return HandlerResponse::Handled;
        }));
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          send_error(res, make_error(500, "internal error: " + what));
        });
    // Counted before the response is written (the logger runs after): a client that has read a
    // response finds it in the metrics.
    server.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      metrics_.count_request(endpoint_label(req.path), res.status);
    });
  }

  // From now on, requests still running at `deadline` are cancelled.
  void set_cancel_deadline(Clock::time_point deadline) {
    cancel_deadline_.store(deadline.time_since_epoch().count());
  }

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  enum class Outcome { kFinished, kClientGone };

  using BodyHandler =
      std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;

  // GET /v1/* handlers: the API key check.
  Handler guarded(Handler handler) {
    return
        [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
          if (!authorized(req)) return send_error(res, unauthorized());
          handler(req, res);
        };
  }

  // POST /v1/* handlers read the body themselves: httplib's own reading caps the bodies of
  // application/x-www-form-urlencoded requests (curl -d's default) at 8 KiB, and does not cap
  // chunked ones. The API key is checked after the body was read, so that a rejected request
  // leaves the keep-alive connection usable.
  httplib::Server::HandlerWithContentReader with_body(BodyHandler handler) {
    return [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                const httplib::ContentReader& reader) {
      std::string body;
      bool too_large = false;
      // The rest of a body too large is read and dropped, as httplib does, so that the
      // connection stays usable.
      const bool read = reader([&](const char* data, size_t size) {
        too_large = too_large || body.size() + size > options_.max_body_bytes;
        if (too_large) {
          body.clear();
        } else {
          body.append(data, size);
        }
        return true;
      });
      if (too_large || res.status == 413) return send_error(res, body_too_large());
      if (!read) return send_error(res, make_error(400, "The request body could not be read"));
      if (!authorized(req)) return send_error(res, unauthorized());
      handler(req, body, res);
    };
  }

  static ApiError unauthorized() {
    return make_error(401, "Incorrect or missing API key (send 'Authorization: Bearer <key>')",
                      std::nullopt, "invalid_api_key");
  }

  ApiError body_too_large() const {
    return make_error(413, "The request body exceeds the limit of " +
                               std::to_string(options_.max_body_bytes) + " bytes");
  }

  // The configured key "Authorization: Bearer <key>" names, else "" (the tenant's key).
  std::string bearer_key(const httplib::Request& req) const {
    if (options_.api_keys.empty()) return {};
    return match_bearer(req.get_header_value("Authorization"), options_.api_keys).value_or("");
  }

  bool authorized(const httplib::Request& req) const {
    if (options_.api_keys.empty()) return true;
    return match_bearer(req.get_header_value("Authorization"), options_.api_keys).has_value();
  }

  static std::string endpoint_label(const std::string& path) {
    static const char* const kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                          "/v1/kv/lookup", "/health", "/metrics"};
    for (const char* route : kRoutes) {
      if (path == route) return route;
    }
    if (path.starts_with("/v1/models/")) return "/v1/models/{model}";
    return "other";
  }

  // GET /v1/models: the one served model.
  void models(const httplib::Request&, httplib::Response& res) {
    res.set_content(openai::model_list_body(options_.served_name, created_,
                                            engine_.model_config().max_context_tokens),
                    "application/json");
  }

  // GET /v1/models/{model}.
  void model(const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    if (name != options_.served_name) return send_error(res, model_not_found(name));
    res.set_content(openai::model_body(options_.served_name, created_,
                                       engine_.model_config().max_context_tokens),
                    "application/json");
  }

  static ApiError model_not_found(const std::string& name) {
    return make_error(404, "The model `" + name + "` does not exist.", "model", "model_not_found");
  }

  // POST /v1/kv/lookup: how much of a request's prompt this replica's KV store holds, for a
  // router choosing where to send it (docs/deployment.md). Runs nothing.
  void lookup(const httplib::Request& req, const std::string& body, httplib::Response& res) {
    const openai::Endpoint endpoint = openai::lookup_endpoint(body);
    StatusOr<openai::ParsedRequest> parsed = openai::parse_request(
        endpoint, body, engine_.model_config().vocab_size, options_.sampling_defaults);
    if (!parsed.ok()) return send_error(res, api_error(parsed.status()));
    StatusOr<std::vector<TokenId>> prompt = tokenize(*parsed);
    if (!prompt.ok()) return send_error(res, api_error(prompt.status()));
    const auto [stored, tier] =
        engine_.stored_prefix(*prompt, tenant_salt(bearer_key(req), parsed->user), {});
    res.set_content(openai::kv_lookup_body(std::ssize(*prompt), stored, tier), "application/json");
  }

  // POST /v1/chat/completions and /v1/completions.
  void generate(Endpoint endpoint, const httplib::Request& req, const std::string& body,
                httplib::Response& res) {
    const Clock::time_point received = Clock::now();
    const bool chat = endpoint == Endpoint::kChatCompletions;
    const model::ModelConfig& config = engine_.model_config();
    StatusOr<openai::ParsedRequest> parsed =
        openai::parse_request(endpoint, body, config.vocab_size, options_.sampling_defaults);
    if (!parsed.ok()) return send_error(res, api_error(parsed.status()));
    if (parsed->model && *parsed->model != options_.served_name) {
      return send_error(res, model_not_found(*parsed->model));
    }

    StatusOr<std::vector<TokenId>> prompt = tokenize(*parsed);
    if (!prompt.ok()) return send_error(res, api_error(prompt.status()));
    const auto num_prompt_tokens = static_cast<int64_t>(prompt->size());
    const char* prompt_field = chat ? "messages" : "prompt";
    // The engine's overflow policy: rejected here with OpenAI's error, or truncated by the engine.
    if (num_prompt_tokens >= config.max_context_tokens && !engine_.truncates_overflow()) {
      return send_error(res, make_error(400,
                                        "This model's maximum context length is " +
                                            std::to_string(config.max_context_tokens) +
                                            " tokens. However, your " + prompt_field +
                                            " resulted in " + std::to_string(num_prompt_tokens) +
                                            " tokens, which leaves no room for the completion.",
                                        prompt_field, "context_length_exceeded"));
    }

    engine::GenerateRequest request;
    request.prompt_token_ids = std::move(*prompt);
    request.sampling = parsed->sampling;
    const ToolCallFormat tool_format = chat && parsed->use_tools && chat_
                                           ? tool_call_format(chat_->source())
                                           : ToolCallFormat::kNone;
    StatusOr<std::shared_ptr<const sampling::Grammar>> grammar =
        structured_.grammar_for(*parsed, tool_format);
    if (!grammar.ok()) return send_error(res, api_error(grammar.status()));
    request.sampling.grammar = std::move(*grammar);
    if (!parsed->max_tokens_given) {
      // A truncated prompt's room is decided by the engine, which stops at a full context.
      const int64_t room = num_prompt_tokens < config.max_context_tokens
                               ? config.max_context_tokens - num_prompt_tokens
                               : config.max_context_tokens;
      request.sampling.max_tokens = chat ? room : std::min(kDefaultCompletionMaxTokens, room);
    }
    request.tenant = tenant_salt(bearer_key(req), parsed->user);
    request.compress_kv = parsed->compress_kv;
    request.kv_task = parsed->kv_task;
    openai::ResponseBuilder::Options response_options;
    response_options.endpoint = endpoint;
    response_options.id = random_request_id(chat ? "chatcmpl-" : "cmpl-");
    response_options.model = options_.served_name;
    response_options.created = std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
    response_options.logprobs = parsed->logprobs;
    response_options.include_usage = parsed->include_usage;
    response_options.tool_format = tool_format;
    if (parsed->echo) {
      response_options.echo = true;
      response_options.prompt_token_ids = request.prompt_token_ids;
      response_options.prompt_text = parsed->prompt_text
                                         ? *parsed->prompt_text
                                         : engine_.tokenizer().decode(request.prompt_token_ids,
                                                                      /*skip_special=*/false);
    }
    StatusOr<std::vector<std::shared_ptr<engine::RequestStream>>> submitted =
        engine_.submit_parallel(std::move(request), parsed->n);
    if (!submitted.ok()) {
      // The engine names the prompt "prompt"; a chat's prompt is its messages.
      Status status = submitted.status();
      if (chat && status.message().starts_with("prompt:")) {
        status = Status(status.code(), "messages" + status.message().substr(6));
      }
      return send_error(res, api_error(status));
    }

    std::vector<Choice> choices;
    for (size_t i = 0; i < submitted->size(); ++i) {
      InFlight in;
      in.stream = std::move((*submitted)[i]);
      if (current_connection_socket() >= 0) in.socket = current_connection_socket();
      in.received = received;
      if (options_.request_timeout.count() > 0) in.timeout_at = received + options_.request_timeout;
      response_options.choice_index = static_cast<int32_t>(i);
      choices.push_back(
          {std::move(in), openai::ResponseBuilder(response_options, engine_.tokenizer())});
    }
    if (parsed->stream) {
      auto state = std::make_shared<StreamState>(
          StreamState{std::move(choices), parsed->include_usage, false});
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, state](size_t, httplib::DataSink& sink) { return stream_events(*state, sink); },
          // Also runs when the provider never did (the server stopped first).
          [this, state](bool) {
            if (!state->done) cancel_all(state->choices);
          });
      return;
    }

    std::optional<std::string> error;
    bool aborted = false;
    bool timed_out = false;
    std::vector<std::string> bodies;
    for (Choice& choice : choices) {
      const Outcome outcome = relay(choice.request, [&](const engine::RequestOutput& out) {
        if (out.finish_reason == engine::FinishReason::kError) {
          error = out.error;
        } else {
          choice.builder.add(out);
          aborted = aborted || out.finish_reason == engine::FinishReason::kAbort;
        }
        return true;
      });
      if (outcome == Outcome::kClientGone) {
        cancel_all(choices);
        res.status = kClientClosedRequest;  // nobody reads it; recorded in /metrics
        return;
      }
      timed_out = timed_out || choice.request.timed_out;
      bodies.push_back(choice.builder.response());
    }
    if (error) return send_error(res, api_error(internal_error(*error)));
    if (aborted && timed_out) {
      return send_error(res, api_error(Status(StatusCode::kDeadlineExceeded,
                                              "The request did not finish within " +
                                                  std::to_string(options_.request_timeout.count()) +
                                                  " s and was cancelled")));
    }
    res.set_content(bodies.size() == 1 ? bodies[0] : openai::merge_choices(bodies),
                    "application/json");
  }

  void cancel_all(const std::vector<Choice>& choices) {
    for (const Choice& choice : choices) engine_.cancel(choice.request.stream->id());
  }

  StatusOr<std::vector<TokenId>> tokenize(const openai::ParsedRequest& parsed) const {
    const tokenizer::Tokenizer& tokenizer = engine_.tokenizer();
    if (parsed.endpoint == Endpoint::kCompletions) {
      if (!parsed.prompt_text) return parsed.prompt_token_ids;
      return tokenizer.encode(*parsed.prompt_text, tokenizer.add_bos_by_default());
    }
    if (!chat_) {
      return failed_precondition_error(
          "The model has no chat template this server understands; use /v1/completions");
    }
    tokenizer::ChatRenderOptions render;
    if (parsed.use_tools) {
      if (tool_call_format(chat_->source()) == ToolCallFormat::kNone) {
        return invalid_argument_error(
            "tools: the model's chat template writes no tool-call format this server parses "
            "(hermes <tool_call>, llama3 JSON, mistral [TOOL_CALLS])");
      }
      render.tools = parsed.tools;
    }
    render.template_kwargs = parsed.chat_template_kwargs;
    StatusOr<tokenizer::ChatPrompt> prompt = chat_->render(parsed.messages, render);
    if (!prompt.ok()) {
      return Status(prompt.status().code(), "messages: " + prompt.status().message());
    }
    return tokenizer.encode(*prompt);
  }

  // Writes one request's server-sent events: a "data: {json}" event per chunk, then
  // "data: [DONE]". Runs on the connection's thread until the request ends; false when the client
  // went away (the request was cancelled).
  bool stream_events(StreamState& state, httplib::DataSink& sink) {
    auto send = [&](const std::string& json) {
      const std::string event = "data: " + json + "\n\n";
      return sink.write(event.data(), event.size());
    };
    engine::Usage usage;  // the prompt once, the choices' completions summed
    for (Choice& choice : state.choices) {
      const Outcome outcome = relay(choice.request, [&](const engine::RequestOutput& out) {
        if (out.finish_reason == engine::FinishReason::kError) {
          return send(openai::error_body(api_error(internal_error(out.error))));
        }
        for (const std::string& chunk : choice.builder.stream_chunks(out)) {
          if (!send(chunk)) return false;
        }
        if (out.finish_reason) {
          const int64_t completion = usage.completion_tokens + out.usage.completion_tokens;
          usage = out.usage;
          usage.completion_tokens = completion;
        }
        return true;
      });
      if (outcome == Outcome::kClientGone) {
        state.done = true;
        cancel_all(state.choices);
        return false;
      }
    }
    state.done = true;
    if (state.include_usage && !send(state.choices.front().builder.usage_chunk(usage))) {
      return false;
    }
    constexpr std::string_view kDone = "data: [DONE]\n\n";
    if (!sink.write(kDone.data(), kDone.size())) return false;
    sink.done();
    return true;
  }

  // Hands each delta of `in` to `on_delta` until the final one, and records its timings. Cancels
  // the request when the client goes away (its connection closes, or `on_delta` returns false
  // because a write failed), and when the shutdown deadline or the request timeout passes (the
  // stream then ends with kAbort, which is relayed).
  template <typename OnDelta>
  Outcome relay(InFlight& in, OnDelta&& on_delta) {
    engine::RequestOutput out;
    while (true) {
      const engine::RequestStream::Wait wait = in.stream->next_for(kPollInterval, &out);
      if (wait == engine::RequestStream::Wait::kEnd) return Outcome::kFinished;
      if (wait == engine::RequestStream::Wait::kTimeout) {
        if (in.socket && peer_closed(*in.socket)) return client_gone(in);
      } else {
        record_timings(in, out);
        if (!on_delta(out)) return client_gone(in);
        if (out.finish_reason) return Outcome::kFinished;
      }
      if (in.cancelled) continue;
      const Clock::time_point now = Clock::now();
      in.timed_out = in.timeout_at && now >= *in.timeout_at;
      if (in.timed_out || now.time_since_epoch().count() >= cancel_deadline_.load()) {
        engine_.cancel(in.stream->id());
        in.cancelled = true;
      }
    }
  }

  Outcome client_gone(InFlight& in) {
    engine_.cancel(in.stream->id());
    metrics_.count_disconnect();
    return Outcome::kClientGone;
  }

  void record_timings(InFlight& in, const engine::RequestOutput& out) {
    const Clock::time_point now = Clock::now();
    if (!out.tokens.empty()) {
      if (!in.last_token) {
        metrics_.observe_time_to_first_token(out.usage.time_to_first_token_ms / 1000.0);
      } else {
        const double gap = std::chrono::duration<double>(now - *in.last_token).count() /
                           static_cast<double>(out.tokens.size());
        for (size_t i = 0; i < out.tokens.size(); ++i) metrics_.observe_inter_token_latency(gap);
      }
      in.last_token = now;
    }
    if (out.finish_reason) {
      metrics_.observe_e2e_latency(std::chrono::duration<double>(now - in.received).count());
      metrics_.count_tokens(out.usage.prompt_tokens, out.usage.completion_tokens);
    }
  }

  engine::Engine& engine_;
  const std::optional<tokenizer::ChatTemplate> chat_;
  const HttpServerOptions options_;
  StructuredOutputs structured_;  // grammars of response_format and forced tool calls
  const int64_t created_;  // Unix seconds, reported as the model's creation time
  Metrics metrics_;
  // Clock::time_point::rep of the shutdown deadline; max until shutdown() starts.
  std::atomic<Clock::rep> cancel_deadline_{std::numeric_limits<Clock::rep>::max()};
};

void block_sigpipe() {
  // A write to a connection the client closed raises SIGPIPE, whose default action kills the
  // process. Blocked here, the write fails with EPIPE instead. Connection threads inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

}  // namespace

struct HttpServer::Impl {
  std::unique_ptr<Service> service;  // outlives `server`, whose handlers call it
  std::unique_ptr<GatedHttpServer> server;
  std::thread listener;  // runs server->listen_after_bind(), which owns the connection threads
  std::atomic<bool> listener_exited{false};
  int port = 0;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { shutdown(std::chrono::milliseconds(0)); }

StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(
    engine::Engine& engine, std::optional<tokenizer::ChatTemplate> chat_template,
    const HttpServerOptions& options) {
  if (options.num_threads < 1) {
    return invalid_argument_error("num_threads must be >= 1, got " +
                                  std::to_string(options.num_threads));
  }
  if (options.max_body_bytes == 0) return invalid_argument_error("max_body_bytes must be > 0");
  if (options.max_connections == 0) return invalid_argument_error("max_connections must be > 0");
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<Service>(engine, std::move(chat_template), options);
  ConnectionLimits limits;
  limits.num_threads = options.num_threads;
  limits.max_connections = options.max_connections;
  limits.header_timeout = options.header_timeout;
  limits.max_body_bytes = options.max_body_bytes;
  impl->server = std::make_unique<GatedHttpServer>(
      limits, [](int status, std::string_view message) {
        return openai::error_body(make_error(status, std::string(message)));
      });
  GatedHttpServer& server = *impl->server;
  impl->service->install(server);

  const std::string address = options.host + ":" + std::to_string(options.port);
  impl->port = server.bind(options.host, options.port);
  if (impl->port <= 0) return Status(StatusCode::kUnavailable, "HTTP: cannot listen on " + address);

  impl->listener = std::thread([&server, &exited = impl->listener_exited] {
    block_sigpipe();
    server.listen_after_bind();
    exited = true;
  });
  // shutdown() can stop the server only once it runs.
  while (!server.is_running() && !impl->listener_exited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.is_running()) {
    impl->listener.join();
    return Status(StatusCode::kUnavailable, "HTTP: cannot serve on " + address);
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::shutdown(std::chrono::milliseconds grace) {
  if (!impl_ || !impl_->listener.joinable()) return;
  impl_->service->set_cancel_deadline(Clock::now() + grace);
  impl_->server->stop();
  impl_->listener.join();
}

}  // namespace strata::server
