#include "strata/server/session_store.h"

namespace strata::server {

SessionStore::Session& SessionStore::touch(const std::string& session_id,
                                           const std::string& system) {
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru_position);
    return it->second;
  }
  if (sessions_.size() >= max_sessions_ && !lru_.empty()) {
    sessions_.erase(lru_.front());
    lru_.pop_front();
  }
  Session& session = sessions_[session_id];
  session.lru_position = lru_.insert(lru_.end(), session_id);
  if (!system.empty()) session.messages.push_back({"system", system});
  return session;
}

std::vector<tokenizer::ChatMessage> SessionStore::begin_turn(
    const std::string& session_id, const tokenizer::ChatMessage& message,
    const std::string& system) const {
  std::scoped_lock lock(mutex_);
  std::vector<tokenizer::ChatMessage> messages;
  if (auto it = sessions_.find(session_id); it != sessions_.end()) {
    messages = it->second.messages;
  } else if (!system.empty()) {
    messages.push_back({"system", system});
  }
  messages.push_back(message);
  return messages;
}

void SessionStore::commit_turn(const std::string& session_id,
                               const tokenizer::ChatMessage& message, const std::string& reply,
                               const std::string& system) {
  std::scoped_lock lock(mutex_);
  Session& session = touch(session_id, system);
  session.messages.push_back(message);
  session.messages.push_back({"assistant", reply});
}

bool SessionStore::erase(const std::string& session_id) {
  std::scoped_lock lock(mutex_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  lru_.erase(it->second.lru_position);
  sessions_.erase(it);
  return true;
}

size_t SessionStore::size() const {
  std::scoped_lock lock(mutex_);
  return sessions_.size();
}

}  // namespace strata::server
