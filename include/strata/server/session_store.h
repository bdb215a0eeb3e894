// Server-side chat sessions: a conversation kept by id so a client sends only its new turn.
// The conversation's KV is reused through the prefix cache (and, with the store, its tiers).
//
// Thread-safe. Bounded: beyond max_sessions the least recently used session is dropped.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/tokenizer/chat_template.h"

namespace strata::server {

class SessionStore {
 public:
  explicit SessionStore(size_t max_sessions = 10000) : max_sessions_(max_sessions) {}

  // The conversation so far with `message` appended; for a session that does not exist yet,
  // `system` (when non-empty) then `message`. Changes nothing: a turn that fails leaves no trace.
  std::vector<tokenizer::ChatMessage> begin_turn(const std::string& session_id,
                                                 const tokenizer::ChatMessage& message,
                                                 const std::string& system = {}) const;
  // Records a finished turn (the user message and the assistant's reply), creating the session
  // with `system` first if it does not exist (new, or dropped by the LRU bound meanwhile).
  void commit_turn(const std::string& session_id, const tokenizer::ChatMessage& message,
                   const std::string& reply, const std::string& system = {});
  // Drops a session; false if it did not exist.
  bool erase(const std::string& session_id);
  size_t size() const;

 private:
  struct Session {
    std::vector<tokenizer::ChatMessage> messages;
    std::list<std::string>::iterator lru_position;
  };
  // The session, created (with `system`, if any) when new. REQUIRES mutex_ held.
  Session& touch(const std::string& session_id, const std::string& system = {});

  const size_t max_sessions_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Session> sessions_;
  std::list<std::string> lru_;  // least recently used first
};

}  // namespace strata::server
