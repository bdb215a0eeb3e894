// SessionStore: provisional turns, the system message, erase, the LRU bound and thread safety.
#include "strata/server/session_store.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace strata::server {
namespace {

using tokenizer::ChatMessage;

// "role:content" per message, for readable comparisons.
std::vector<std::string> flatten(const std::vector<ChatMessage>& messages) {
  std::vector<std::string> out;
  for (const ChatMessage& m : messages) out.push_back(m.role + ":" + m.content.value_or(""));
  return out;
}

using Lines = std::vector<std::string>;

// prefix + i (not operator+ on a literal: GCC 12 warns falsely with -Wrestrict there).
std::string numbered(const char* prefix, int i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

TEST(SessionStoreTest, NewSessionStartsWithSystemThenMessage) {
  SessionStore store;
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "hi"}, "be brief")),
            (Lines{"system:be brief", "user:hi"}));
  EXPECT_EQ(store.size(), 0u) << "a turn exists only once committed";
  store.commit_turn("s", {"user", "hi"}, "ok", "be brief");
  EXPECT_EQ(store.size(), 1u);
}

TEST(SessionStoreTest, NewSessionWithoutSystemHasOnlyTheMessage) {
  SessionStore store;
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "hi"})), (Lines{"user:hi"}));
}

TEST(SessionStoreTest, BeginTurnDoesNotChangeTheConversationUntilCommit) {
  SessionStore store;
  store.begin_turn("s", {"user", "first"}, "sys");
  // The first turn was never committed (e.g. it failed): a retry sees no trace of it.
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "retry"}, "sys")),
            (Lines{"system:sys", "user:retry"}));
  EXPECT_EQ(store.size(), 0u);

  store.commit_turn("s", {"user", "retry"}, "answer", "sys");
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "next"})),
            (Lines{"system:sys", "user:retry", "assistant:answer", "user:next"}));
  // begin_turn again without commit: still the committed conversation plus the new message only.
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "other"})),
            (Lines{"system:sys", "user:retry", "assistant:answer", "user:other"}));
}

TEST(SessionStoreTest, SystemMessageIsUsedOnlyOnCreation) {
  SessionStore store;
  store.begin_turn("s", {"user", "a"}, "first system");
  store.commit_turn("s", {"user", "a"}, "b", "first system");
  store.commit_turn("s", {"user", "c"}, "d", "second system");  // ignored: the session exists
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "e"}, "second system")),
            (Lines{"system:first system", "user:a", "assistant:b", "user:c", "assistant:d",
                   "user:e"}));
}

TEST(SessionStoreTest, SessionsAreIndependent) {
  SessionStore store;
  store.begin_turn("a", {"user", "1"});
  store.commit_turn("a", {"user", "1"}, "one");
  EXPECT_EQ(flatten(store.begin_turn("b", {"user", "2"})), (Lines{"user:2"}));
  EXPECT_EQ(store.size(), 1u) << "b has no committed turn yet";
  store.commit_turn("b", {"user", "2"}, "two");
  EXPECT_EQ(store.size(), 2u);
}

TEST(SessionStoreTest, EraseDropsTheSession) {
  SessionStore store;
  store.begin_turn("s", {"user", "a"}, "sys");
  store.commit_turn("s", {"user", "a"}, "b", "sys");
  EXPECT_TRUE(store.erase("s"));
  EXPECT_EQ(store.size(), 0u);
  EXPECT_FALSE(store.erase("s"));
  EXPECT_FALSE(store.erase("never"));
  // Recreated from scratch, with the new system message.
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "x"}, "new sys")),
            (Lines{"system:new sys", "user:x"}));
}

TEST(SessionStoreTest, LruBoundDropsLeastRecentlyUsed) {
  SessionStore store(/*max_sessions=*/2);
  store.begin_turn("a", {"user", "a1"});
  store.commit_turn("a", {"user", "a1"}, "ra");
  store.begin_turn("b", {"user", "b1"});
  store.commit_turn("b", {"user", "b1"}, "rb");
  // Use "a" again so that "b" becomes the least recently used.
  store.commit_turn("a", {"user", "a2"}, "ra2");
  store.commit_turn("c", {"user", "c1"}, "rc");
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.erase("b"));  // dropped
  EXPECT_TRUE(store.erase("a"));
  EXPECT_TRUE(store.erase("c"));
}

TEST(SessionStoreTest, LruDroppedSessionStartsOverWhenUsedAgain) {
  SessionStore store(/*max_sessions=*/1);
  store.begin_turn("a", {"user", "a1"}, "sys");
  store.commit_turn("a", {"user", "a1"}, "ra", "sys");
  store.commit_turn("b", {"user", "b1"}, "rb");  // drops "a"
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(flatten(store.begin_turn("a", {"user", "a2"})), (Lines{"user:a2"}));
}

TEST(SessionStoreTest, ConcurrentTurnsOnManySessions) {
  constexpr int kThreads = 8;
  constexpr int kTurns = 200;
  SessionStore store(/*max_sessions=*/kThreads + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, t] {
      const std::string own = numbered("own", t);
      for (int i = 0; i < kTurns; ++i) {
        const ChatMessage m{"user", std::to_string(i)};
        store.begin_turn(own, m, "sys");
        store.commit_turn(own, m, numbered("r", i), "sys");
        // A session every thread shares, and one that comes and goes.
        store.begin_turn("shared", m);
        store.commit_turn("shared", m, "s");
        store.erase("shared");
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Every thread's own session holds exactly its committed turns, in order.
  for (int t = 0; t < kThreads; ++t) {
    const auto messages = store.begin_turn(numbered("own", t), {"user", "end"});
    ASSERT_EQ(messages.size(), 1u + 2u * kTurns + 1u) << "thread " << t;
    EXPECT_EQ(messages.front().role, "system");
    for (int i = 0; i < kTurns; ++i) {
      EXPECT_EQ(messages[1 + 2 * i].content, std::to_string(i));
      EXPECT_EQ(messages[2 + 2 * i].content, numbered("r", i));
    }
  }
  EXPECT_LE(store.size(), static_cast<size_t>(kThreads + 1));
}

}  // namespace
}  // namespace strata::server
