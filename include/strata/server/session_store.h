// Server-side chat sessions: a conversation kept by id so a client sends only its new turn.
// The conversation's KV is reused through the prefix cache (and, with the store, its tiers).
//
// Durable when opened with a journal (serve puts it beside the KV store's SSD tier): every
// finished turn and every erase is appended as one checksummed line, written and fdatasync'ed
// before commit_turn() returns, and open() replays the journal, so sessions survive kill -9 along
// with their KV on the SSD. A torn or corrupt line (a crash mid-write, a flipped bit) loses only
// that record; open() then rewrites the journal compactly (one record per live session).
//
// Shared between replicas (share_through(): the Redis server of the KV store's remote tier): each
// finished turn also writes the whole conversation to Redis, and each turn begins from the
// longer of the local and the shared copy, so a session continues on whichever replica serves
// its next turn (docs/deployment.md). An erase leaves a tombstone there that other replicas
// honour. Redis down or slow: the local copy serves (bounded by the client's timeout).
//
// Thread-safe. Bounded: beyond max_sessions the least recently used session is dropped, and a
// tenant beyond max_per_tenant sessions drops its own least recently used one (so no tenant can
// push another's sessions out). Session ids are tenant-qualified, "TENANT\nID" (ids without a
// newline belong to the "" tenant).
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "strata/common/status.h"
#include "strata/tokenizer/chat_template.h"

namespace strata::store {
class RedisClient;
}

namespace strata::server {

class SessionStore {
 public:
  explicit SessionStore(size_t max_sessions = 10000, size_t max_per_tenant = 1000)
      : max_sessions_(max_sessions), max_per_tenant_(max_per_tenant) {}
  // A store journaled to `journal_path` (created if missing), with the sessions it holds.
  // UNAVAILABLE if the journal cannot be read or written.
  static StatusOr<std::unique_ptr<SessionStore>> open(const std::string& journal_path,
                                                      size_t max_sessions = 10000,
                                                      size_t max_per_tenant = 1000);
  ~SessionStore();
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Shares the sessions with other replicas through `redis` (keys expire `ttl` after their
  // last turn). Call before serving.
  void share_through(std::shared_ptr<store::RedisClient> redis, std::chrono::seconds ttl);

  // The conversation so far with `message` appended; for a session that does not exist yet,
  // `system` (when non-empty) then `message`. A turn that fails leaves no trace; a shared copy
  // longer than the local one (turns served by another replica) replaces it first.
  std::vector<tokenizer::ChatMessage> begin_turn(const std::string& session_id,
                                                 const tokenizer::ChatMessage& message,
                                                 const std::string& system = {});
  // Records a finished turn (the user message and the assistant's reply), creating the session
  // with `system` first if it does not exist (new, or dropped by the LRU bound meanwhile). With
  // a journal, the turn is durable when this returns OK; an error (a full disk) leaves the turn
  // in memory only and is returned for the caller to report.
  Status commit_turn(const std::string& session_id, const tokenizer::ChatMessage& message,
                     const std::string& reply, const std::string& system = {});
  // One running turn of a session: while it lives, lease_turn() of the same session fails.
  class TurnLease {
   public:
    TurnLease(TurnLease&& other) noexcept : store_(other.store_), id_(std::move(other.id_)) {
      other.store_ = nullptr;
    }
    TurnLease& operator=(TurnLease&&) = delete;
    ~TurnLease();

   private:
    friend class SessionStore;
    TurnLease(SessionStore* store, std::string id) : store_(store), id_(std::move(id)) {}
    SessionStore* store_;
    std::string id_;
  };
  // Reserves `session_id` for one turn, or nullopt when a turn of it is already running: a
  // session's turns are serialized, since two at once would both answer the same history and
  // both be recorded, a conversation that never happened.
  std::optional<TurnLease> lease_turn(const std::string& session_id);

  // Drops a session; false if it did not exist.
  bool erase(const std::string& session_id);
  size_t size() const;
  // Journal lines open() skipped as torn or corrupt.
  int64_t corrupt_records() const { return corrupt_records_; }

 private:
  struct Session {
    std::vector<tokenizer::ChatMessage> messages;
    std::list<std::string>::iterator lru_position;
  };
  // The session, created (with `system`, if any) when new. REQUIRES mutex_ held.
  Session& touch(const std::string& session_id, const std::string& system = {});
  // Forgets a session (not journaled). REQUIRES mutex_ held.
  void forget(std::unordered_map<std::string, Session>::iterator it);
  // Appends one checksummed record and syncs it. REQUIRES mutex_ held.
  Status append(const std::string& json);
  // The shared copy's messages (nullopt: none, erased, or Redis unavailable; `erased` set for a
  // tombstone). REQUIRES mutex_ not held (network).
  std::optional<std::vector<tokenizer::ChatMessage>> read_shared(const std::string& session_id,
                                                                 bool* erased) const;
  // Writes the shared copy (messages, or a tombstone when null). REQUIRES mutex_ not held.
  void write_shared(const std::string& session_id,
                    const std::vector<tokenizer::ChatMessage>* messages) const;

  const size_t max_sessions_;
  const size_t max_per_tenant_;
  std::unordered_map<std::string, size_t> per_tenant_;  // sessions held per tenant
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Session> sessions_;
  std::list<std::string> lru_;  // least recently used first
  std::unordered_set<std::string> running_turns_;  // sessions with a leased turn
  int journal_fd_ = -1;         // -1: in memory only
  std::string journal_path_;
  int64_t corrupt_records_ = 0;
  std::shared_ptr<store::RedisClient> redis_;  // null: not shared
  std::string ttl_ms_;
};

}  // namespace strata::server
