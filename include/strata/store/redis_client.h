// A small Redis client over hiredis for what replicas share: the remote KV tier (redis_tier.h)
// and chat sessions (server/session_store.h). A pool of blocking connections, each command batch
// pipelined on one connection, every socket operation bounded by a timeout. hiredis stays in
// redis_client.cpp.
//
// Failure model. A connection that cannot be made, times out, or breaks is discarded, and the
// client refuses every call for `retry_after` (UNAVAILABLE at once, no I/O), so a down or slow
// server costs a request at most one timeout before it recomputes; the first call after that tries
// again. Error replies (OOM when the server is full, WRONGTYPE, ...) are replies, not failures: the
// connection stays; except NOAUTH, WRONGPASS and NOPERM, which fail the call as "auth". Each transition between reachable and unreachable is logged once, with the
// reason.
//
// Thread-safe: each call takes a pooled connection (or opens one) for its whole batch.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"

struct redisContext;

namespace strata::store {

struct RedisReply {
  enum class Type { kString, kInteger, kNil, kStatus, kError, kArray };
  Type type = Type::kNil;
  std::string text;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

// One command: its arguments, binary-safe ("SET", key, value, "PX", "1000").
using RedisCommand = std::vector<std::string_view>;

struct RedisClientOptions {
  std::string address;   // "host:port" or "unix:/path/to/socket"
  std::string username;  // ACL user (AUTH username password); empty: the default user
  // The environment variable holding the password (AUTH); empty: no AUTH.
  std::string password_env;
  int32_t database = 0;  // SELECT
  std::chrono::milliseconds timeout{200};  // connect, and each read or write on the socket
  std::chrono::milliseconds retry_after{1000};
  int32_t max_idle_connections = 8;
};

class RedisClient {
 public:
  // INVALID_ARGUMENT for an address that is neither host:port nor unix:path; FAILED_PRECONDITION
  // when password_env names an unset variable. Connects lazily.
  static StatusOr<std::unique_ptr<RedisClient>> create(RedisClientOptions options);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Sends `commands` pipelined on one connection; one reply per command, in order. UNAVAILABLE
  // when the server cannot be reached or answered too slowly (then for retry_after as well).
  StatusOr<std::vector<RedisReply>> run(std::span<const RedisCommand> commands);

  // False while calls are refused after a failure.
  bool available() const;
  // False from a failed call until a call succeeds (what an operator should see).
  bool reachable() const;
  const std::string& address() const { return options_.address; }
  // Failures by reason ("unreachable", "timeout", "auth", "protocol"), cumulative.
  std::map<std::string, int64_t> failures() const;

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const;
  };
  using Connection = std::unique_ptr<redisContext, ContextDeleter>;

  explicit RedisClient(RedisClientOptions options) : options_(std::move(options)) {}
  StatusOr<Connection> connect();
  // Sends `commands` pipelined on `c` and reads one reply each (fail() on a socket error).
  StatusOr<std::vector<RedisReply>> exchange(redisContext& c, std::span<const RedisCommand> commands);
  // Marks the server unreachable for retry_after, counts and logs `reason` (once per outage).
  Status fail(const std::string& reason, const std::string& detail);
  void recovered();

  RedisClientOptions options_;
  std::string password_;
  std::string host_;  // or the socket path when unix_
  int port_ = 0;
  bool unix_ = false;
  mutable std::mutex mutex_;
  std::vector<Connection> idle_;
  std::chrono::steady_clock::time_point retry_at_{};
  bool down_ = false;  // logged as unreachable, not yet recovered
  std::map<std::string, int64_t> failures_;
};

}  // namespace strata::store
