// The remote tier against a real redis-server that each test starts: values and session records
// round trip between two processes' tiers, and a corrupt value, a server that is down, slow,
// full or wants a password each give an error (counted by reason) within the timeout, never
// wrong bytes. Then two stores sharing one server: what one saves, the other finds, loads and
// reports as the remote tier's; a corrupt remote value is recomputed, not served.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "store_test_util.h"
#include "strata/store/redis_tier.h"
#include "support/redis_server.h"

namespace strata::store {
namespace {

using test_util::RedisServer;
using Clock = std::chrono::steady_clock;

RedisOptions remote_options(const RedisServer& server) {
  RedisOptions o;
  o.address = server.address();
  o.capacity_bytes = int64_t{64} << 20;
  o.timeout = std::chrono::milliseconds(200);
  o.retry_after = std::chrono::milliseconds(100);
  o.ttl = std::chrono::seconds(600);
  o.layout_tag = 7;
  return o;
}

std::unique_ptr<RedisTier> open_tier(const RedisOptions& o) {
  StatusOr<std::unique_ptr<RedisTier>> tier = RedisTier::open(o);
  EXPECT_TRUE(tier.ok()) << tier.status().to_string();
  return tier.ok() ? std::move(tier).value() : nullptr;
}

// Chunks of `t` (filled with their hash pattern) put into `tier` as item `id`.
Status put_chunks(RedisTier& tier, ItemId id, std::span<const TokenId> t, const ItemRecord& record) {
  const std::vector<kv::ChunkHash> hashes = chain(t);
  std::vector<std::vector<std::byte>> bytes(hashes.size(), std::vector<std::byte>(kChunkBytes));
  std::vector<ChunkKey> keys;
  std::vector<std::span<const std::byte>> values;
  for (size_t i = 0; i < hashes.size(); ++i) {
    fill(bytes[i].data(), hashes[i]);
    keys.push_back({id, static_cast<int32_t>(i), hashes[i]});
    values.emplace_back(bytes[i]);
  }
  std::optional<Reservation> room = tier.reserve(std::vector<int64_t>(hashes.size(), kChunkBytes));
  if (!room) return resource_exhausted_error("no room");
  return tier.put(record, *room, keys, values);
}

TEST(RedisTierTest, ValuesAndSessionRecordsRoundTripBetweenProcesses) {
  RedisServer server;
  std::unique_ptr<RedisTier> a = open_tier(remote_options(server));
  std::unique_ptr<RedisTier> b = open_tier(remote_options(server));
  const std::vector<TokenId> t = tokens(1, 3 * kBlock + 1);
  const std::vector<kv::ChunkHash> hashes = chain(t);
  ASSERT_TRUE(put_chunks(*a, 5, t, {"session-digest", true, 0, ""}).ok());
  EXPECT_TRUE(a->contains({5, 2, hashes[2]}));
  EXPECT_EQ(a->used_bytes(), 3 * a->footprint(kChunkBytes));

  // Another process finds the session's item and the content, and reads the same bytes.
  StatusOr<std::optional<RecoveredItem>> found = b->find_session("session-digest");
  ASSERT_TRUE(found.ok() && found->has_value());
  RecoveredItem item = **found;
  EXPECT_TRUE(item.attributes.exact);
  ASSERT_EQ(item.chunks.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(item.chunks[i].hash, hashes[i]);
  const std::vector<TokenId> longer = tokens(1, 5 * kBlock + 1);  // 2 chunks more than stored
  StatusOr<int64_t> held = b->count_held(chain(longer));
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, 3);
  item.id = 77;
  for (ChunkKey& k : item.chunks) k.item = 77;
  b->attach(item);
  std::vector<AlignedBuffer> out(3);
  const std::vector<int32_t> indices = {0, 1, 2};
  ASSERT_TRUE(b->get(77, indices, out).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(out[i].size(), kChunkBytes);
    EXPECT_TRUE(holds(out[i].data(), hashes[i])) << "chunk " << i;
  }
  EXPECT_FALSE(b->find_session("another").value().has_value());

  // Another layout (model or format) never meets these keys.
  RedisOptions other = remote_options(server);
  other.layout_tag = 8;
  std::unique_ptr<RedisTier> c = open_tier(other);
  EXPECT_EQ(c->count_held(hashes).value(), 0);
  EXPECT_FALSE(c->find_session("session-digest").value().has_value());

  // Ending the session deletes its record for everyone.
  ASSERT_TRUE(b->erase_session("session-digest").ok());
  EXPECT_FALSE(a->find_session("session-digest").value().has_value());
}

TEST(RedisTierTest, CorruptValueIsDataLossAndDeleted) {
  RedisServer server;
  std::unique_ptr<RedisTier> tier = open_tier(remote_options(server));
  const std::vector<TokenId> t = tokens(2, 2 * kBlock + 1);
  const ItemRecord record{"", true, 0, ""};
  ASSERT_TRUE(put_chunks(*tier, 1, t, record).ok());
  const std::string key = tier->chunk_key(record, {1, 1, chain(t)[1]});
  ASSERT_EQ(server.cli("EXISTS " + key), "1\n");
  // One payload byte changed: the header still parses, the checksum does not match.
  ASSERT_EQ(server.cli("SETRANGE " + key + " 1000 X"), std::to_string(40 + kChunkBytes) + "\n");
  std::vector<AlignedBuffer> out(2);
  const std::vector<int32_t> indices = {0, 1};
  const Status status = tier->get(1, indices, out);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss) << status.to_string();
  EXPECT_EQ(server.cli("EXISTS " + key), "0\n");  // nobody reads it again
  EXPECT_EQ(tier->failures()["corrupt"], 1);
  // A value under the wrong key (another chunk's bytes) fails the hash check too.
  const std::string key0 = tier->chunk_key(record, {1, 0, chain(t)[0]});
  ASSERT_EQ(server.cli("COPY " + key0 + " " + key), "1\n");
  EXPECT_EQ(tier->get(1, indices, out).code(), StatusCode::kDataLoss);
}

TEST(RedisTierTest, DownServerIsUnavailableWithinTheTimeoutAndRecovers) {
  RedisServer server;
  std::unique_ptr<RedisTier> tier = open_tier(remote_options(server));
  const std::vector<TokenId> t = tokens(3, 2 * kBlock + 1);
  ASSERT_TRUE(put_chunks(*tier, 1, t, {"", true, 0, ""}).ok());
  server.stop();
  std::vector<AlignedBuffer> out(1);
  const std::vector<int32_t> indices = {0};
  const auto start = Clock::now();
  const Status status = tier->get(1, indices, out);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.to_string();
  EXPECT_FALSE(tier->available());
  EXPECT_GE(tier->failures()["unreachable"], 1);
  // Refused at once while it waits to retry.
  EXPECT_EQ(tier->count_held(chain(t)).status().code(), StatusCode::kUnavailable);

  server.start();  // empty: a restarted server lost its keys
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_TRUE(tier->available());
  EXPECT_FALSE(tier->healthy());  // until a call succeeds
  EXPECT_EQ(tier->get(1, indices, out).code(), StatusCode::kNotFound);
  EXPECT_TRUE(tier->healthy());
  EXPECT_EQ(tier->failures()["missing"], 1);
  EXPECT_TRUE(put_chunks(*tier, 2, t, {"", true, 0, ""}).ok());
  EXPECT_TRUE(tier->get(2, indices, out).ok());
}

TEST(RedisTierTest, SlowServerTimesOut) {
  RedisServer server;
  std::unique_ptr<RedisTier> tier = open_tier(remote_options(server));
  const std::vector<TokenId> t = tokens(4, 2 * kBlock + 1);
  ASSERT_TRUE(tier->count_held(chain(t)).ok());  // a pooled connection
  ASSERT_EQ(server.cli("CLIENT PAUSE 2000 ALL"), "OK\n");
  const auto start = Clock::now();
  const StatusOr<int64_t> held = tier->count_held(chain(t));
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1000));
  EXPECT_EQ(held.status().code(), StatusCode::kUnavailable);
  EXPECT_GE(tier->failures()["timeout"], 1);
}

TEST(RedisTierTest, FullServerRefusesWritesAndTooLargeItemsAreNotSent) {
  RedisServer server({"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"});
  RedisOptions o = remote_options(server);
  std::unique_ptr<RedisTier> tier = open_tier(o);
  Status status;
  for (int i = 0; i < 64 && status.ok(); ++i) {
    status = put_chunks(*tier, i + 1, tokens(100 + i, 40 * kBlock + 1), {"", true, 0, ""});
  }
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.to_string();
  EXPECT_GE(tier->failures()["full"], 1);

  o.max_item_bytes = 2 * (kChunkBytes + 40);
  std::unique_ptr<RedisTier> small = open_tier(o);
  EXPECT_FALSE(small->reserve(std::vector<int64_t>(3, kChunkBytes)).has_value());
  EXPECT_EQ(small->failures()["too_large"], 1);
}

TEST(RedisTierTest, AConnectionTheServerRefusesIsAProtocolFailure) {
  RedisServer server;
  RedisOptions o = remote_options(server);
  o.database = 99;  // beyond the server's 16 databases: SELECT fails on every new connection
  std::unique_ptr<RedisTier> tier = open_tier(o);
  const std::vector<TokenId> t = tokens(6, kBlock + 1);
  EXPECT_EQ(put_chunks(*tier, 1, t, {"", true, 0, ""}).code(), StatusCode::kUnavailable);
  EXPECT_EQ(tier->failures()["protocol"], 1);
  EXPECT_FALSE(tier->healthy());
  o.database = 3;
  std::unique_ptr<RedisTier> other = open_tier(o);
  ASSERT_TRUE(put_chunks(*other, 1, t, {"", true, 0, ""}).ok());
  EXPECT_EQ(server.cli("-n 3 DBSIZE"), "1\n");  // in the database it selected
}

TEST(RedisTierTest, PasswordComesFromTheEnvironment) {
  RedisServer server({}, "s3cret");
  RedisOptions o = remote_options(server);
  const std::vector<TokenId> t = tokens(5, kBlock + 1);
  std::unique_ptr<RedisTier> without = open_tier(o);
  EXPECT_EQ(put_chunks(*without, 1, t, {"", true, 0, ""}).code(), StatusCode::kUnavailable);
  EXPECT_GE(without->failures()["auth"], 1);

  o.password_env = "STRATA_TEST_REDIS_PASSWORD";
  ::unsetenv("STRATA_TEST_REDIS_PASSWORD");
  EXPECT_EQ(RedisTier::open(o).status().code(), StatusCode::kFailedPrecondition);
  ::setenv("STRATA_TEST_REDIS_PASSWORD", "s3cret", 1);
  std::unique_ptr<RedisTier> with = open_tier(o);
  EXPECT_TRUE(put_chunks(*with, 1, t, {"", true, 0, ""}).ok());
  ::unsetenv("STRATA_TEST_REDIS_PASSWORD");
}

StoreOptions shared_options(const RedisServer& server) {
  StoreOptions o = options(nullptr, 16);
  o.remote = remote_options(server);
  return o;
}

constexpr TierIndex kRemote = 1;  // below DRAM, without an SSD tier

TEST(SharedTierTest, AnotherStoreLoadsWhatOneStoredAndReportsTheRemoteTier) {
  RedisServer server;
  std::unique_ptr<KvStore> a = KvStore::open(shared_options(server)).value();
  std::unique_ptr<KvStore> b = KvStore::open(shared_options(server)).value();
  const std::vector<TokenId> turn1 = tokens(6, 3 * kBlock + 2);
  ASSERT_TRUE(save(*a, turn1, "conversation").ok());
  a->wait_idle();  // written through
  EXPECT_EQ(a->stats().tier("remote").chunks, 3);

  // By content: b has nothing of its own, finds it there, reads it into DRAM, and its first load
  // says where it came from.
  EXPECT_FALSE(b->find(turn1, root(), {}).has_value());
  b->look_up_shared(turn1, root(), {});
  TierIndex served = -1;
  std::optional<StoreMatch> m = load_and_check(*b, turn1, &served);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->num_chunks, 3);
  EXPECT_EQ(served, kRemote);
  EXPECT_EQ(b->stats().shared_found, 1);
  EXPECT_EQ(b->stats().tier("remote").hits, 1);
  ASSERT_TRUE(load_and_check(*b, turn1, &served).has_value());
  EXPECT_EQ(served, kDramTier);  // now it is here

  // By session: the conversation grew on a; b's next turn finds the longer item there.
  std::vector<TokenId> turn2 = turn1;
  const std::vector<TokenId> more = tokens(7, 2 * kBlock);
  turn2.insert(turn2.end(), more.begin(), more.end());
  ASSERT_TRUE(save(*a, turn2, "conversation").ok());
  a->wait_idle();
  b->look_up_shared(turn2, root(), "conversation");
  std::optional<StoreMatch> by_session = b->find(turn2, root(), "conversation");
  ASSERT_TRUE(by_session.has_value());
  EXPECT_EQ(by_session->num_chunks, 5);
  EXPECT_EQ(b->stats().shared_found, 2);
  // A prompt b already holds as long as the remote tier: nothing indexed twice.
  b->look_up_shared(turn1, root(), {});
  EXPECT_EQ(b->stats().shared_found, 2);
}

// An item whose leading chunks are valid only together (a turn resumed from H2O's kept chunks,
// SaveRequest::whole_chunks) stays on its replica: the shared records do not carry whole chunks,
// so another replica could match some of them. Neither write-through nor the shutdown's flush
// sends it; a raw item beside it is written through.
TEST(SharedTierTest, AnItemWithWholeChunksStaysOffTheSharedTier) {
  RedisServer server;
  {
    std::unique_ptr<KvStore> a = KvStore::open(shared_options(server)).value();
    const std::vector<TokenId> resumed = tokens(8, 4 * kBlock + 1);
    SaveRequest request{"s", false, 0, chain(resumed), 0, 0, /*whole_chunks=*/2};
    StatusOr<SaveTicket> ticket = a->begin_save(request);
    ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
    for (size_t i = 0; i < ticket->destinations.size(); ++i) {
      fill(ticket->destinations[i], request.chain[i]);
    }
    a->commit_save(*std::move(ticket), nullptr, 0);
    ASSERT_TRUE(save(*a, tokens(9, 3 * kBlock + 1)).ok());
    a->wait_idle();
    EXPECT_EQ(a->stats().tier("remote").chunks, 3) << "only the raw item is written through";
  }  // a clean shutdown flushes DRAM-only items down
  std::unique_ptr<KvStore> b = KvStore::open(shared_options(server)).value();
  const std::vector<TokenId> resumed = tokens(8, 4 * kBlock + 1);
  b->look_up_shared(resumed, root(), "s");
  EXPECT_FALSE(b->find(resumed, root(), "s").has_value());
  const std::vector<TokenId> raw = tokens(9, 3 * kBlock + 1);
  b->look_up_shared(raw, root(), {});
  EXPECT_TRUE(b->find(raw, root(), {}).has_value()) << "the raw item is shared";
}

TEST(SharedTierTest, CorruptRemoteValueIsRecomputedNotServed) {
  RedisServer server;
  std::unique_ptr<KvStore> a = KvStore::open(shared_options(server)).value();
  std::unique_ptr<KvStore> b = KvStore::open(shared_options(server)).value();
  const std::vector<TokenId> t = tokens(8, 2 * kBlock + 1);
  ASSERT_TRUE(save(*a, t).ok());
  a->wait_idle();
  std::unique_ptr<RedisTier> probe = open_tier(remote_options(server));
  const std::string key = probe->chunk_key({"", true, 0, ""}, {0, 1, chain(t)[1]});
  ASSERT_NE(server.cli("SETRANGE " + key + " 500 Z"), "0\n");
  b->look_up_shared(t, root(), {});
  EXPECT_FALSE(b->find(t, root(), {}).has_value());  // dropped: the prompt is computed
  EXPECT_EQ(b->stats().corrupt_chunks, 1);
}

TEST(SharedTierTest, ServerDownCostsOneTimeoutAndTheStoreGoesOn) {
  RedisServer server;
  StoreOptions o = shared_options(server);
  o.remote->retry_after = std::chrono::seconds(30);  // still unavailable when the test looks
  std::unique_ptr<KvStore> a = KvStore::open(o).value();
  server.stop();
  const std::vector<TokenId> t = tokens(9, 2 * kBlock + 1);
  const auto start = Clock::now();
  a->look_up_shared(t, root(), "s");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  ASSERT_TRUE(save(*a, t).ok());  // the write-through fails; DRAM keeps it
  a->wait_idle();
  EXPECT_FALSE(a->stats().tier("remote").available);
  TierIndex served = -1;
  ASSERT_TRUE(load_and_check(*a, t, &served).has_value());
  EXPECT_EQ(served, kDramTier);
}

}  // namespace
}  // namespace strata::store
