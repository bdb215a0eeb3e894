#include "strata/store/redis_client.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <sys/time.h>

namespace strata::store {
namespace {

using Clock = std::chrono::steady_clock;

timeval to_timeval(std::chrono::milliseconds ms) {
  return {static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}

RedisReply convert(const redisReply& r) {
  RedisReply out;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.text.assign(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      for (size_t i = 0; i < r.elements; ++i) out.elements.push_back(convert(*r.element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

// "timeout" for a socket operation that ran past its limit, else "unreachable".
std::string io_reason(const redisContext& c) {
  if (c.err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) return "timeout";
  if (c.err == REDIS_ERR_PROTOCOL) return "protocol";
  return "unreachable";
}

std::string io_detail(const redisContext& c) {
  if (c.err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return "no answer within the timeout";
  }
  return c.errstr;
}

}  // namespace

void RedisClient::ContextDeleter::operator()(redisContext* c) const { redisFree(c); }

StatusOr<std::unique_ptr<RedisClient>> RedisClient::create(RedisClientOptions options) {
  std::unique_ptr<RedisClient> client(new RedisClient(std::move(options)));
  if (const std::string& env = client->options_.password_env; !env.empty()) {
    const char* value = std::getenv(env.c_str());
    if (value == nullptr) {
      return failed_precondition_error("redis: the password variable " + env + " is not set");
    }
    client->password_ = value;
  }
  const std::string& a = client->options_.address;
  if (a.starts_with("unix:")) {
    client->unix_ = true;
    client->host_ = a.substr(5);
    if (client->host_.empty()) return invalid_argument_error("redis address 'unix:' names no socket");
    return client;
  }
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return invalid_argument_error("redis address '" + a + "': expected host:port or unix:/path");
  }
  std::string host = a.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);  // [::1]
  int port = 0;
  const char* first = a.data() + colon + 1;
  const char* last = a.data() + a.size();
  const auto [end, ec] = std::from_chars(first, last, port);
  if (ec != std::errc() || end != last || port <= 0 || port > 65535 || host.empty()) {
    return invalid_argument_error("redis address '" + a + "': expected host:port or unix:/path");
  }
  client->host_ = std::move(host);
  client->port_ = port;
  return client;
}

RedisClient::~RedisClient() = default;

bool RedisClient::available() const {
  std::scoped_lock lock(mutex_);
  return Clock::now() >= retry_at_;
}

bool RedisClient::reachable() const {
  std::scoped_lock lock(mutex_);
  return !down_;
}

std::map<std::string, int64_t> RedisClient::failures() const {
  std::scoped_lock lock(mutex_);
  return failures_;
}

Status RedisClient::fail(const std::string& reason, const std::string& detail) {
  std::scoped_lock lock(mutex_);
  retry_at_ = Clock::now() + options_.retry_after;
  idle_.clear();  // a restarted or lost server broke them too
  ++failures_[reason];
  if (!down_) {
    down_ = true;
    spdlog::warn("KV store: redis at {} is unavailable ({}: {}); requests recompute what it holds, "
                 "retrying every {} ms",
                 options_.address, reason, detail, options_.retry_after.count());
  }
  return Status(StatusCode::kUnavailable, "redis at " + options_.address + ": " + reason + ": " + detail);
}

void RedisClient::recovered() {
  std::scoped_lock lock(mutex_);
  if (down_) {
    down_ = false;
    spdlog::info("KV store: redis at {} answers again", options_.address);
  }
}

StatusOr<RedisClient::Connection> RedisClient::connect() {
  const timeval tv = to_timeval(options_.timeout);
  Connection c(unix_ ? redisConnectUnixWithTimeout(host_.c_str(), tv)
                     : redisConnectWithTimeout(host_.c_str(), port_, tv));
  if (c == nullptr) return fail("unreachable", "cannot allocate a connection");
  if (c->err != 0) return fail(io_reason(*c), io_detail(*c));
  if (redisSetTimeout(c.get(), tv) != REDIS_OK) return fail("unreachable", c->errstr);
  (void)redisEnableKeepAlive(c.get());
  std::vector<RedisCommand> hello;
  if (!password_.empty()) {
    if (options_.username.empty()) {
      hello.push_back({"AUTH", password_});
    } else {
      hello.push_back({"AUTH", options_.username, password_});
    }
  }
  const std::string db = std::to_string(options_.database);
  if (options_.database != 0) hello.push_back({"SELECT", db});
  STRATA_ASSIGN_OR_RETURN(std::vector<RedisReply> replies, exchange(*c, hello));
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].type == RedisReply::Type::kError) {
      return fail(hello[i][0] == "AUTH" ? "auth" : "protocol", replies[i].text);
    }
  }
  return c;
}

StatusOr<std::vector<RedisReply>> RedisClient::exchange(redisContext& c,
                                                        std::span<const RedisCommand> commands) {
  for (const RedisCommand& cmd : commands) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (std::string_view a : cmd) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(&c, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
        REDIS_OK) {
      return fail(io_reason(c), io_detail(c));
    }
  }
  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(&c, &raw) != REDIS_OK || raw == nullptr) {
      return fail(io_reason(c), io_detail(c));
    }
    replies.push_back(convert(*static_cast<redisReply*>(raw)));
    freeReplyObject(raw);
  }
  return replies;
}

StatusOr<std::vector<RedisReply>> RedisClient::run(std::span<const RedisCommand> commands) {
  Connection c;
  {
    std::scoped_lock lock(mutex_);
    if (Clock::now() < retry_at_) {
      return Status(StatusCode::kUnavailable,
                    "redis at " + options_.address + " is unavailable (retrying later)");
    }
    if (!idle_.empty()) {
      c = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (c == nullptr) {
    STRATA_ASSIGN_OR_RETURN(c, connect());
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<RedisReply> replies, exchange(*c, commands));
  for (const RedisReply& r : replies) {
    // A server that wants a password this client lacks (or a user without the rights) is a
    // deployment error, not a refused value.
    if (r.type == RedisReply::Type::kError &&
        (r.text.starts_with("NOAUTH") || r.text.starts_with("WRONGPASS") ||
         r.text.starts_with("NOPERM"))) {
      return fail("auth", r.text);
    }
  }
  recovered();
  std::scoped_lock lock(mutex_);
  if (std::ssize(idle_) < options_.max_idle_connections) idle_.push_back(std::move(c));
  return replies;
}

}  // namespace strata::store
