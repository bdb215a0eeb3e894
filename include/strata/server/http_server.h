// The OpenAI-compatible HTTP front door over an Engine, beside the gRPC one in the same process:
//
//   POST /v1/chat/completions, POST /v1/completions   (stream: server-sent events, "data: [DONE]")
//   GET  /v1/models, GET /health, GET /metrics        (Prometheus text format)
//
// Errors use OpenAI's body {"error": {"message", "type", "param", "code"}}; an invalid field is a
// 400 naming it in `param`. A client that disconnects has its request cancelled, so its KV is
// freed. HTTP and JSON library headers stay inside the implementation.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/common/status.h"
#include "strata/engine/engine.h"
#include "strata/tokenizer/chat_template.h"

namespace strata::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;          // 0 picks a free port (see HttpServer::port())
  std::string served_name;  // the one model id: /v1/models lists it, requests may name only it
  // Accepted "Authorization: Bearer <key>" values for /v1/*; empty = no authentication.
  std::vector<std::string> api_keys;
  size_t max_body_bytes = 8 << 20;  // larger request bodies are answered 413
  // A generation request still running after this long is cancelled: a stream then ends with
  // finish_reason "abort", a non-streamed request is answered 504. 0 = no limit.
  std::chrono::seconds request_timeout{0};
  // Threads running requests. A connection holds one only while a whole request it sent is
  // served: one thread reads every connection's request bytes, within the timeouts below.
  int num_threads = 64;
  // Connections open at once; more are answered 503 and closed (keep below `ulimit -n`).
  size_t max_connections = 1024;
  // A request's header must arrive within this of its first byte (or of the connection's accept),
  // else 408 and close; its body within 10 s + 1 s per 64 KiB after that. An idle keep-alive
  // connection is closed after 5 s.
  std::chrono::milliseconds header_timeout{10'000};
  // What a request's unset sampling fields take (max_tokens has its own rule).
  sampling::SamplingParams sampling_defaults;
};

class HttpServer {
 public:
  // Binds and starts serving on its own threads. `engine` must outlive the server. chat_template
  // may be empty (then /v1/chat/completions answers 400). UNAVAILABLE if the address cannot be
  // bound; INVALID_ARGUMENT for options out of range (num_threads < 1, max_body_bytes == 0,
  // max_connections == 0).
  static StatusOr<std::unique_ptr<HttpServer>> start(
      engine::Engine& engine, std::optional<tokenizer::ChatTemplate> chat_template,
      const HttpServerOptions& options);
  // Shuts down with no grace period.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Stops accepting connections, lets in-flight requests finish for up to `grace`, then cancels
  // them (a stream ends with finish_reason "abort"), closes every connection and joins the server
  // threads. Idempotent. Not thread-safe against itself.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::server
