// SessionStore: provisional turns, the system message, erase, the LRU bound and thread safety;
// sessions shared by two stores (replicas) through a real redis-server.
#include "strata/server/session_store.h"

#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "strata/store/redis_client.h"
#include "support/redis_server.h"
#include "support/temp_dir.h"

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
  EXPECT_TRUE(store.commit_turn("s", {"user", "hi"}, "ok", "be brief").ok());
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

  EXPECT_TRUE(store.commit_turn("s", {"user", "retry"}, "answer", "sys").ok());
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "next"})),
            (Lines{"system:sys", "user:retry", "assistant:answer", "user:next"}));
  // begin_turn again without commit: still the committed conversation plus the new message only.
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "other"})),
            (Lines{"system:sys", "user:retry", "assistant:answer", "user:other"}));
}

TEST(SessionStoreTest, SystemMessageIsUsedOnlyOnCreation) {
  SessionStore store;
  store.begin_turn("s", {"user", "a"}, "first system");
  EXPECT_TRUE(store.commit_turn("s", {"user", "a"}, "b", "first system").ok());
  EXPECT_TRUE(store.commit_turn("s", {"user", "c"}, "d", "second system")
                  .ok());  // ignored: the session exists
  EXPECT_EQ(flatten(store.begin_turn("s", {"user", "e"}, "second system")),
            (Lines{"system:first system", "user:a", "assistant:b", "user:c", "assistant:d",
                   "user:e"}));
}

TEST(SessionStoreTest, SessionsAreIndependent) {
  SessionStore store;
  store.begin_turn("a", {"user", "1"});
  EXPECT_TRUE(store.commit_turn("a", {"user", "1"}, "one").ok());
  EXPECT_EQ(flatten(store.begin_turn("b", {"user", "2"})), (Lines{"user:2"}));
  EXPECT_EQ(store.size(), 1u) << "b has no committed turn yet";
  EXPECT_TRUE(store.commit_turn("b", {"user", "2"}, "two").ok());
  EXPECT_EQ(store.size(), 2u);
}

TEST(SessionStoreTest, EraseDropsTheSession) {
  SessionStore store;
  store.begin_turn("s", {"user", "a"}, "sys");
  EXPECT_TRUE(store.commit_turn("s", {"user", "a"}, "b", "sys").ok());
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
  EXPECT_TRUE(store.commit_turn("a", {"user", "a1"}, "ra").ok());
  store.begin_turn("b", {"user", "b1"});
  EXPECT_TRUE(store.commit_turn("b", {"user", "b1"}, "rb").ok());
  // Use "a" again so that "b" becomes the least recently used.
  EXPECT_TRUE(store.commit_turn("a", {"user", "a2"}, "ra2").ok());
  EXPECT_TRUE(store.commit_turn("c", {"user", "c1"}, "rc").ok());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.erase("b"));  // dropped
  EXPECT_TRUE(store.erase("a"));
  EXPECT_TRUE(store.erase("c"));
}

// A tenant past its own cap drops its own least recently used session, never another tenant's:
// one tenant cannot flush everyone's conversations out of the shared bound.
TEST(SessionStoreTest, ATenantPastItsCapDropsItsOwnSessionsOnly) {
  SessionStore store(/*max_sessions=*/100, /*max_per_tenant=*/2);
  EXPECT_TRUE(store.commit_turn("b\nkeep", {"user", "b1"}, "rb").ok());
  for (int i = 0; i < 50; ++i) {
    const std::string id = "a\n" + std::to_string(i);
    EXPECT_TRUE(store.commit_turn(id, {"user", "a"}, "ra").ok());
  }
  EXPECT_EQ(store.size(), 3u);  // a's two newest and b's one
  EXPECT_TRUE(store.erase("b\nkeep"));
  EXPECT_TRUE(store.erase("a\n49"));
  EXPECT_TRUE(store.erase("a\n48"));
  EXPECT_FALSE(store.erase("a\n47"));
  // Ids without a tenant share the "" tenant's cap.
  for (const char* id : {"x", "y", "z"}) EXPECT_TRUE(store.commit_turn(id, {"user", "u"}, "r").ok());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.erase("x"));
}

TEST(SessionStoreTest, LruDroppedSessionStartsOverWhenUsedAgain) {
  SessionStore store(/*max_sessions=*/1);
  store.begin_turn("a", {"user", "a1"}, "sys");
  EXPECT_TRUE(store.commit_turn("a", {"user", "a1"}, "ra", "sys").ok());
  EXPECT_TRUE(store.commit_turn("b", {"user", "b1"}, "rb").ok());  // drops "a"
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
        EXPECT_TRUE(store.commit_turn(own, m, numbered("r", i), "sys").ok());
        // A session every thread shares, and one that comes and goes.
        store.begin_turn("shared", m);
        EXPECT_TRUE(store.commit_turn("shared", m, "s").ok());
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

// One turn of a session at a time: a second lease fails until the first ends.
TEST(SessionStoreTest, TurnsOfOneSessionAreSerialized) {
  SessionStore store;
  std::optional<SessionStore::TurnLease> first = store.lease_turn("s");
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(store.lease_turn("s").has_value());
  EXPECT_TRUE(store.lease_turn("other").has_value());  // and released at once
  EXPECT_TRUE(store.lease_turn("other").has_value());
  first.reset();
  EXPECT_TRUE(store.lease_turn("s").has_value());
}

// A journaled store reopened (as after kill -9) holds the same sessions; erases stay erased; a
// torn last line and a corrupt line lose only their own record; reopening compacts the journal.
TEST(SessionStoreJournalTest, SessionsSurviveReopening) {
  test_util::TempDir dir;
  const std::string path = (dir.path() / "sessions.journal").string();
  {
    auto store = SessionStore::open(path);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ASSERT_TRUE((*store)->commit_turn("a", {"user", "q1"}, "r1", "sys").ok());
    ASSERT_TRUE((*store)->commit_turn("a", {"user", "q2 \u00e9\n\"quoted\""}, "r2").ok());
    ASSERT_TRUE((*store)->commit_turn("b", {"user", "x"}, "y").ok());
    ASSERT_TRUE((*store)->commit_turn("c", {"user", "gone"}, "soon").ok());
    EXPECT_TRUE((*store)->erase("c"));
  }
  auto reopened = SessionStore::open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  EXPECT_EQ((*reopened)->size(), 2u);
  EXPECT_EQ((*reopened)->corrupt_records(), 0);
  const auto a = (*reopened)->begin_turn("a", {"user", "q3"});
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[0].content, "sys");
  EXPECT_EQ(a[3].content, "q2 \u00e9\n\"quoted\"");
  EXPECT_EQ(a[4].content, "r2");
  EXPECT_EQ((*reopened)->begin_turn("c", {"user", "?"}).size(), 1u);
  ASSERT_TRUE((*reopened)->commit_turn("b", {"user", "x2"}, "y2").ok());
  reopened->reset();

  // Damage the journal: flip a byte inside b's turn record and tear a record at the end.
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string journal = text.str();
  const size_t b_turn = journal.find("\"x2\"");
  ASSERT_NE(b_turn, std::string::npos);
  journal[b_turn + 1] = 'z';
  journal += journal.substr(0, 30);  // a torn line
  std::ofstream(path, std::ios::trunc) << journal;
  auto damaged = SessionStore::open(path);
  ASSERT_TRUE(damaged.ok());
  EXPECT_EQ((*damaged)->corrupt_records(), 2);
  EXPECT_EQ((*damaged)->begin_turn("b", {"user", "?"}).size(), 3u);  // x, y: the x2 turn is lost
  EXPECT_EQ((*damaged)->begin_turn("a", {"user", "?"}).size(), 6u);
  damaged->reset();
  // Reopening rewrote the journal clean, one record per session.
  auto clean = SessionStore::open(path);
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ((*clean)->corrupt_records(), 0);
  EXPECT_EQ((*clean)->size(), 2u);
}

TEST(SessionStoreJournalTest, AnUnwritableJournalIsAnError) {
  auto store = SessionStore::open("/nonexistent-dir/sessions.journal");
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable);
}

std::shared_ptr<store::RedisClient> client(const test_util::RedisServer& server) {
  return store::RedisClient::create({server.address(), "", "", 0, std::chrono::milliseconds(200),
                                     std::chrono::milliseconds(100)})
      .value();
}

TEST(SharedSessionsTest, ASessionContinuesOnAnotherReplicaAndBack) {
  test_util::RedisServer server;
  SessionStore a, b;
  a.share_through(client(server), std::chrono::seconds(60));
  b.share_through(client(server), std::chrono::seconds(60));
  ASSERT_TRUE(a.commit_turn("t\ns", {"user", "hi"}, "hello", "be brief").ok());
  // b never served it: its turn begins from a's conversation.
  EXPECT_EQ(flatten(b.begin_turn("t\ns", {"user", "again"})),
            (Lines{"system:be brief", "user:hi", "assistant:hello", "user:again"}));
  ASSERT_TRUE(b.commit_turn("t\ns", {"user", "again"}, "sure").ok());
  // Back on a, whose own copy is one turn behind: the shared, longer one wins.
  EXPECT_EQ(flatten(a.begin_turn("t\ns", {"user", "third"})),
            (Lines{"system:be brief", "user:hi", "assistant:hello", "user:again", "assistant:sure",
                   "user:third"}));
  // Redis never holds the id in clear.
  EXPECT_EQ(server.cli("KEYS '*s*'").find("t\ns"), std::string::npos);

  // Ended on b: a drops its copy at its next turn, and a new conversation starts.
  EXPECT_TRUE(b.erase("t\ns"));
  EXPECT_EQ(flatten(a.begin_turn("t\ns", {"user", "new"})), (Lines{"user:new"}));
  EXPECT_EQ(a.size(), 0u);
}

TEST(SharedSessionsTest, RedisDownLeavesTheLocalCopyServing) {
  test_util::RedisServer server;
  SessionStore a;
  a.share_through(client(server), std::chrono::seconds(60));
  ASSERT_TRUE(a.commit_turn("s", {"user", "hi"}, "hello").ok());
  server.stop();
  EXPECT_EQ(flatten(a.begin_turn("s", {"user", "more"})),
            (Lines{"user:hi", "assistant:hello", "user:more"}));
  EXPECT_TRUE(a.commit_turn("s", {"user", "more"}, "ok").ok());  // kept here
  EXPECT_EQ(a.size(), 1u);
}

TEST(SharedSessionsTest, ACorruptSharedRecordIsIgnored) {
  test_util::RedisServer server;
  SessionStore a, b;
  a.share_through(client(server), std::chrono::seconds(60));
  b.share_through(client(server), std::chrono::seconds(60));
  ASSERT_TRUE(a.commit_turn("s", {"user", "hi"}, "hello").ok());
  const std::string key = server.cli("KEYS 'strata:sessions:*'");
  ASSERT_FALSE(key.empty());
  ASSERT_NE(server.cli("SETRANGE " + key.substr(0, key.size() - 1) + " 30 X"), "");
  EXPECT_EQ(flatten(b.begin_turn("s", {"user", "?"})), (Lines{"user:?"}));
  EXPECT_EQ(flatten(a.begin_turn("s", {"user", "?"})),
            (Lines{"user:hi", "assistant:hello", "user:?"}));

  // Records whose checksum holds but whose shape does not (another writer's, a future
  // version's): ignored, never thrown.
  const std::string name = key.substr(0, key.size() - 1);
  for (const std::string json :
       {R"({"id":5,"messages":[]})", R"({"id":"s","messages":{"role":"user"}})",
        R"({"id":"s","messages":[{"role":1,"content":"x"}]})", R"({"id":"s"})", R"([1,2])"}) {
    char sum[17];
    std::snprintf(sum, sizeof(sum), "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(json.data(), json.size())));
    ASSERT_EQ(server.cli("SET " + name + " '" + std::string(sum) + " " + json + "'"), "OK\n");
    EXPECT_EQ(flatten(b.begin_turn("s", {"user", "?"})), (Lines{"user:?"})) << json;
  }
}

}  // namespace
}  // namespace strata::server
