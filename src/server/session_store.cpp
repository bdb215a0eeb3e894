#include "strata/server/session_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/store/redis_client.h"

namespace strata::server {
namespace {

using Json = nlohmann::json;

// The tenant of a tenant-qualified session id "TENANT\nID" ("" without a newline).
std::string tenant_of(const std::string& session_id) {
  const size_t newline = session_id.find('\n');
  return newline == std::string::npos ? std::string() : session_id.substr(0, newline);
}

// A journal line: 16 hex digits of XXH3-64 over the JSON, a space, the JSON, a newline.
std::string checksummed(const std::string& json) {
  char sum[17];
  std::snprintf(sum, sizeof(sum), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(json.data(), json.size())));
  return std::string(sum) + " " + json + "\n";
}

// The JSON of a well-formed line; nullopt for a torn or corrupt one.
std::optional<Json> parse_line(const std::string& line) {
  if (line.size() < 18 || line[16] != ' ') return std::nullopt;
  const std::string json = line.substr(17);
  char sum[17];
  std::snprintf(sum, sizeof(sum), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(json.data(), json.size())));
  if (line.compare(0, 16, sum) != 0) return std::nullopt;
  Json parsed = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return std::nullopt;
  return parsed;
}

Status errno_error(const std::string& what, const std::string& path) {
  return Status(StatusCode::kUnavailable, what + " " + path + ": " + std::strerror(errno));
}

Status write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_error("cannot write", path);
    done += static_cast<size_t>(n);
  }
  return Status();
}

// Invalid UTF-8 (which the front doors never let through) would become U+FFFD, not an exception.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json messages_json(const std::vector<tokenizer::ChatMessage>& messages) {
  Json list = Json::array();
  for (const tokenizer::ChatMessage& m : messages) {
    list.push_back({{"role", m.role}, {"content", m.content.value_or("")}});
  }
  return list;
}

// The Redis key of a session: a digest, so Redis never holds a tenant's key or a client's id.
std::string shared_key(const std::string& session_id) {
  const XXH128_hash_t h = XXH3_128bits(session_id.data(), session_id.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string("strata:sessions:1:") + hex;
}

}  // namespace

StatusOr<std::unique_ptr<SessionStore>> SessionStore::open(const std::string& journal_path,
                                                           size_t max_sessions,
                                                           size_t max_per_tenant) {
  auto store = std::make_unique<SessionStore>(max_sessions, max_per_tenant);
  store->journal_path_ = journal_path;
  // Replay: "session" records replace a whole conversation (written by compaction), "turn"
  // records append one, "erase" records drop one.
  std::ifstream in(journal_path);
  std::string line;
  while (std::getline(in, line)) {
    const std::optional<Json> record = parse_line(line);
    if (!record || !record->contains("op") || !record->contains("id")) {
      ++store->corrupt_records_;
      continue;
    }
    const std::string op = (*record)["op"].get<std::string>();
    const std::string id = (*record)["id"].get<std::string>();
    if (op == "erase") {
      store->erase(id);
    } else if (op == "session") {
      store->erase(id);
      Session& session = store->touch(id);
      for (const Json& m : (*record)["messages"]) {
        session.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
    } else if (op == "turn") {
      Session& session = store->touch(id, record->value("system", ""));
      session.messages.push_back(
          {(*record)["role"].get<std::string>(), (*record)["content"].get<std::string>()});
      session.messages.push_back({"assistant", (*record)["reply"].get<std::string>()});
    } else {
      ++store->corrupt_records_;
    }
  }
  if (store->corrupt_records_ > 0) {
    spdlog::warn("sessions: skipped {} torn or corrupt records of {}", store->corrupt_records_,
                 journal_path);
  }
  // Compact: the live sessions, least recently used first, into a new file renamed over the old.
  const std::string tmp = journal_path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("cannot create", tmp);
  std::string compact;
  for (const std::string& id : store->lru_) {
    compact += checksummed(dump(Json{
        {"op", "session"}, {"id", id}, {"messages", messages_json(store->sessions_.at(id).messages)}}));
  }
  Status written = write_all(fd, compact, tmp);
  if (written.ok() && ::fdatasync(fd) != 0) written = errno_error("cannot sync", tmp);
  ::close(fd);
  if (written.ok() && std::rename(tmp.c_str(), journal_path.c_str()) != 0) {
    written = errno_error("cannot rename over", journal_path);
  }
  STRATA_RETURN_IF_ERROR(written);
  store->journal_fd_ = ::open(journal_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (store->journal_fd_ < 0) return errno_error("cannot open", journal_path);
  spdlog::info("sessions: {} restored from {}", store->sessions_.size(), journal_path);
  return store;
}

SessionStore::~SessionStore() {
  if (journal_fd_ >= 0) ::close(journal_fd_);
}

Status SessionStore::append(const std::string& json) {
  if (journal_fd_ < 0) return Status();
  STRATA_RETURN_IF_ERROR(write_all(journal_fd_, checksummed(json), journal_path_));
  if (::fdatasync(journal_fd_) != 0) return errno_error("cannot sync", journal_path_);
  return Status();
}

void SessionStore::forget(std::unordered_map<std::string, Session>::iterator it) {
  const std::string tenant = tenant_of(it->first);
  if (--per_tenant_[tenant] == 0) per_tenant_.erase(tenant);
  lru_.erase(it->second.lru_position);
  sessions_.erase(it);
}

SessionStore::Session& SessionStore::touch(const std::string& session_id,
                                           const std::string& system) {
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru_position);
    return it->second;
  }
  const std::string tenant = tenant_of(session_id);
  if (per_tenant_[tenant] >= max_per_tenant_) {
    // The tenant's own least recently used session makes room, never another tenant's.
    auto oldest = std::find_if(lru_.begin(), lru_.end(),
                               [&](const std::string& id) { return tenant_of(id) == tenant; });
    if (oldest != lru_.end()) forget(sessions_.find(*oldest));
  }
  if (sessions_.size() >= max_sessions_ && !lru_.empty()) forget(sessions_.find(lru_.front()));
  Session& session = sessions_[session_id];
  session.lru_position = lru_.insert(lru_.end(), session_id);
  ++per_tenant_[tenant];
  if (!system.empty()) session.messages.push_back({"system", system});
  return session;
}

void SessionStore::share_through(std::shared_ptr<store::RedisClient> redis,
                                 std::chrono::seconds ttl) {
  redis_ = std::move(redis);
  ttl_ms_ = std::to_string(std::chrono::milliseconds(ttl).count());
}

std::optional<std::vector<tokenizer::ChatMessage>> SessionStore::read_shared(
    const std::string& session_id, bool* erased) const {
  *erased = false;
  if (redis_ == nullptr) return std::nullopt;
  const std::string key = shared_key(session_id);
  const std::vector<store::RedisCommand> get = {{"GET", key}};
  StatusOr<std::vector<store::RedisReply>> reply = redis_->run(get);
  if (!reply.ok() || (*reply)[0].type != store::RedisReply::Type::kString) return std::nullopt;
  const std::optional<Json> record = parse_line((*reply)[0].text);
  auto is_string = [](const Json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string();
  };
  // The id guards against a digest collision; a record of any other shape is ignored (the local
  // copy serves), whoever wrote it.
  std::vector<tokenizer::ChatMessage> messages;
  bool valid = record && is_string(*record, "id") && (*record)["id"] == session_id &&
               record->contains("messages") && (*record)["messages"].is_array();
  for (size_t i = 0; valid && i < (*record)["messages"].size(); ++i) {
    const Json& m = (*record)["messages"][i];
    valid = is_string(m, "role") && is_string(m, "content");
    if (valid) messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  if (!valid) {
    spdlog::warn("sessions: ignoring a malformed shared record of a session");
    return std::nullopt;
  }
  if (record->contains("erased") && (*record)["erased"] == true) {
    *erased = true;
    return std::nullopt;
  }
  return messages;
}

void SessionStore::write_shared(const std::string& session_id,
                                const std::vector<tokenizer::ChatMessage>* messages) const {
  if (redis_ == nullptr) return;
  Json record = {{"id", session_id}};
  if (messages == nullptr) {
    record["erased"] = true;
    record["messages"] = Json::array();
  } else {
    record["messages"] = messages_json(*messages);
  }
  std::string value = checksummed(dump(record));
  value.pop_back();  // the newline
  const std::string key = shared_key(session_id);
  const std::vector<store::RedisCommand> set = {{"SET", key, value, "PX", ttl_ms_}};
  // Redis down: the turn is kept here (and journaled); another replica will not see it.
  (void)redis_->run(set);
}

std::vector<tokenizer::ChatMessage> SessionStore::begin_turn(
    const std::string& session_id, const tokenizer::ChatMessage& message,
    const std::string& system) {
  bool erased = false;
  std::optional<std::vector<tokenizer::ChatMessage>> shared = read_shared(session_id, &erased);
  std::scoped_lock lock(mutex_);
  auto it = sessions_.find(session_id);
  if (erased && it != sessions_.end()) {  // ended on another replica
    forget(it);
    it = sessions_.end();
    const Status journaled = append(dump(Json{{"op", "erase"}, {"id", session_id}}));
    if (!journaled.ok()) spdlog::warn("sessions: {}", journaled.message());
  }
  if (shared && (it == sessions_.end() || shared->size() > it->second.messages.size())) {
    // Turns another replica served: the shared copy is the conversation.
    Session& session = touch(session_id);
    session.messages = std::move(*shared);
    const Status journaled = append(dump(
        Json{{"op", "session"}, {"id", session_id}, {"messages", messages_json(session.messages)}}));
    if (!journaled.ok()) spdlog::warn("sessions: {}", journaled.message());
    it = sessions_.find(session_id);
  }
  std::vector<tokenizer::ChatMessage> messages;
  if (it != sessions_.end()) {
    messages = it->second.messages;
  } else if (!system.empty()) {
    messages.push_back({"system", system});
  }
  messages.push_back(message);
  return messages;
}

Status SessionStore::commit_turn(const std::string& session_id,
                                 const tokenizer::ChatMessage& message, const std::string& reply,
                                 const std::string& system) {
  std::vector<tokenizer::ChatMessage> conversation;
  Status journaled;
  {
    std::scoped_lock lock(mutex_);
    const bool is_new = sessions_.find(session_id) == sessions_.end();
    Session& session = touch(session_id, system);
    session.messages.push_back(message);
    session.messages.push_back({"assistant", reply});
    journaled = append(dump(Json{{"op", "turn"},
                                 {"id", session_id},
                                 {"system", is_new ? system : std::string()},
                                 {"role", message.role},
                                 {"content", message.content.value_or("")},
                                 {"reply", reply}}));
    if (redis_ != nullptr) conversation = session.messages;
  }
  if (redis_ != nullptr) write_shared(session_id, &conversation);
  return journaled;
}

std::optional<SessionStore::TurnLease> SessionStore::lease_turn(const std::string& session_id) {
  std::scoped_lock lock(mutex_);
  if (!running_turns_.insert(session_id).second) return std::nullopt;
  return TurnLease(this, session_id);
}

SessionStore::TurnLease::~TurnLease() {
  if (store_ == nullptr) return;
  std::scoped_lock lock(store_->mutex_);
  store_->running_turns_.erase(id_);
}

bool SessionStore::erase(const std::string& session_id) {
  bool erased_shared = false;
  if (redis_ != nullptr) {  // a tombstone: replicas holding a copy drop it at its next turn
    bool already = false;
    erased_shared = read_shared(session_id, &already).has_value();
    write_shared(session_id, nullptr);
  }
  std::scoped_lock lock(mutex_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return erased_shared;
  forget(it);
  const Status journaled = append(dump(Json{{"op", "erase"}, {"id", session_id}}));
  if (!journaled.ok()) spdlog::warn("sessions: {}", journaled.message());
  return true;
}

size_t SessionStore::size() const {
  std::scoped_lock lock(mutex_);
  return sessions_.size();
}

}  // namespace strata::server
