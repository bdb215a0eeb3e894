// The gRPC front door: strata.v1.Generation (proto/strata/v1/generation.proto) plus the standard
// grpc.health.v1 health service, over an Engine. gRPC headers stay inside the implementation.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/common/status.h"
#include "strata/engine/engine.h"
#include "strata/server/session_store.h"
#include "strata/tokenizer/chat_template.h"

namespace strata::server {

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 50051;  // 0 picks a free port (see GrpcServer::port())
  std::string served_name;  // model name reported by GetModelInfo
  // Accepted keys, sent as "authorization: Bearer <key>" metadata; empty = no authentication.
  // The key a request presents is its tenant: prefix-cache entries are salted with it, so one
  // tenant's cached prompts never serve (or reveal themselves to) another.
  std::vector<std::string> api_keys;
  // What a request's unset sampling fields take (max_tokens has its own default).
  sampling::SamplingParams sampling_defaults;
};

class GrpcServer {
 public:
  // Binds and starts serving. `engine`, `sessions` must outlive the server. chat_template may be
  // empty (then Chat answers FAILED_PRECONDITION). UNAVAILABLE if the address cannot be bound.
  static StatusOr<std::unique_ptr<GrpcServer>> start(
      engine::Engine& engine, std::optional<tokenizer::ChatTemplate> chat_template,
      SessionStore& sessions, const GrpcServerOptions& options);
  ~GrpcServer();

  int port() const;
  // Stops accepting calls and lets in-flight ones finish for up to `grace`; then cancels their
  // requests, each stream ending with a final message (finish reason ABORT, usage).
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct Impl;
  explicit GrpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::server
