// The KV store under tensor parallelism: rank 0's feed of its store's events, replayed by another
// rank's RankStore on a store of its own (real KvStores in DRAM), loads named by content, and the
// per-rank options.
#include "tensor_parallel_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "store_test_util.h"

namespace strata::executor {
namespace {

using store::chain;
using store::fill;
using store::holds;
using store::tokens;

constexpr SeqId kSeq{11};

std::unique_ptr<store::KvStore> open_store(int64_t dram_chunks) {
  StatusOr<std::unique_ptr<store::KvStore>> opened =
      store::KvStore::open(store::options(nullptr, dram_chunks));
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  return std::move(opened).value();
}

TensorShard shard_of(int32_t rank, int32_t world, int64_t kv_heads, int64_t max_kv_heads) {
  TensorShard s;
  s.rank = rank;
  s.world_size = world;
  s.kv_heads = {0, kv_heads};
  s.max_kv_heads = max_kv_heads;
  return s;
}

// Rank 0's store with a saved conversation, and a follower replaying what its coordinator reports.
class RankStoreTest : public ::testing::Test {
 protected:
  RankStoreTest()
      : shard_(shard_of(0, 2, 1, 1)),
        // The other rank answers a held_by_all query after the events before it, as it does
        // through the executor's messages.
        feed_(shard_,
              [this](std::string query, int64_t own) {
                EXPECT_TRUE(follower_->apply(feed_.take_events()).ok());
                Reader r(query);
                return std::min(own, follower_->held(r));
              }),
        leader_(open_store(16)),
        follower_(std::make_unique<RankStore>(open_store(16))) {}

  // A turn saved the way the restore coordinator saves it on rank 0 (its first pass writes
  // `first_pass` blocks, decode passes the rest), each event replayed by the follower before the
  // pass that follows it; chunks hold their hash's pattern on both ranks.
  void save_turn(const std::vector<TokenId>& t, const std::string& session, int64_t first_pass) {
    const std::vector<kv::ChunkHash> hashes = chain(t);
    store::SaveRequest request{session, true, 0, {hashes.begin(), hashes.begin() + first_pass}};
    StatusOr<store::SaveTicket> ticket = leader_->begin_save(request);
    ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
    feed_.begin_save(kSeq, request);
    pass(*ticket, ticket->first_chunk, first_pass - ticket->first_chunk, hashes);
    for (int64_t b = first_pass; b < std::ssize(hashes); ++b) {
      ASSERT_EQ(leader_->extend_save(&*ticket, std::span(hashes).subspan(b, 1)), 1);
      feed_.extend_save(kSeq, b, std::span(hashes).subspan(b, 1));
      pass(*ticket, b, 1, hashes);
    }
    leader_->commit_save(*std::move(ticket), nullptr, 0);
    feed_.end_save(kSeq, store::SaveEnd::kCommit);
    ASSERT_TRUE(follower_->apply(feed_.take_events()).ok());
  }

  // A pass saving blocks [first, first + n) on both ranks.
  void pass(const store::SaveTicket& ticket, int64_t first, int64_t n,
            const std::vector<kv::ChunkHash>& hashes) {
    ASSERT_TRUE(follower_->apply(feed_.take_events()).ok());
    std::vector<std::byte*> mine(static_cast<size_t>(n));
    follower_->save(kSeq, first, &mine);
    for (int64_t i = 0; i < n; ++i) {
      fill(ticket.destinations[first - ticket.first_chunk + i], hashes[first + i]);
      fill(mine[i], hashes[first + i]);
    }
  }

  // What rank 0 pins of `t`'s stored prefix, named for the follower.
  std::vector<store::StoredRun> runs_of(const std::vector<TokenId>& t, const std::string& session) {
    std::optional<store::StoreMatch> m = leader_->find(t, store::root(), session);
    EXPECT_TRUE(m.has_value());
    if (!m) return {};
    std::optional<store::StoredRun> run = leader_->describe_run(m->item, 0, m->num_chunks);
    EXPECT_TRUE(run.has_value());
    return {*run};
  }

  TensorShard shard_;
  FollowerFeed feed_;
  std::unique_ptr<store::KvStore> leader_;
  std::unique_ptr<RankStore> follower_;
};

TEST_F(RankStoreTest, FollowerLoadsItsOwnCopyOfWhatRankZeroSaved) {
  for (const std::string session : {"", "conversation-key"}) {
    SCOPED_TRACE("session '" + session + "'");
    const std::vector<TokenId> t = tokens(session.empty() ? 1 : 2, 5 * store::kBlock + 1);
    save_turn(t, session, 3);
    std::vector<store::StoredRun> runs = runs_of(t, session);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].count, 5);
    std::vector<const std::byte*> chunks;
    ASSERT_TRUE(follower_->load(runs, &chunks));
    ASSERT_EQ(chunks.size(), 5u);
    const std::vector<kv::ChunkHash> hashes = chain(t);
    for (size_t i = 0; i < chunks.size(); ++i) EXPECT_TRUE(holds(chunks[i], hashes[i])) << i;
    follower_->after_pass();
  }
}

TEST_F(RankStoreTest, ALoadTheFollowerCannotPinReadsZeros) {
  const std::vector<TokenId> t = tokens(3, 4 * store::kBlock + 1);
  save_turn(t, "", 4);
  std::vector<store::StoredRun> runs = runs_of(t, "");
  ASSERT_EQ(runs.size(), 1u);
  auto fails = [&](store::StoredRun run) {
    std::vector<const std::byte*> chunks;
    const bool pinned = follower_->load(std::span(&run, 1), &chunks);
    EXPECT_EQ(std::ssize(chunks), run.count);
    const std::vector<std::byte> zeros(store::kChunkBytes);
    for (const std::byte* c : chunks) {
      if (!pinned) EXPECT_EQ(std::memcmp(c, zeros.data(), zeros.size()), 0);
    }
    follower_->after_pass();
    return !pinned;
  };
  EXPECT_FALSE(fails(runs[0]));
  store::StoredRun other = runs[0];
  other.last_hash.low ^= 1;  // another conversation's chunk
  EXPECT_TRUE(fails(other));
  other = runs[0];
  other.token_offset = store::kBlock;  // another shape
  EXPECT_TRUE(fails(other));
  other = runs[0];
  other.count += 1;  // past its end
  EXPECT_TRUE(fails(other));
  other = runs[0];
  other.session = "a session it has no item for";  // found by content all the same
  EXPECT_FALSE(fails(other));
}

TEST_F(RankStoreTest, ASaveWithAGapOnTheFollowerIsGivenBack) {
  // The follower's DRAM holds 2 chunks: rank 0 reserves 4 at once, the follower 2; rank 0's
  // extension from chunk 4 leaves chunks 2 and 3 unwritten there.
  follower_ = std::make_unique<RankStore>(open_store(2));
  const std::vector<TokenId> t = tokens(4, 6 * store::kBlock + 1);
  save_turn(t, "", 4);
  std::vector<store::StoredRun> runs = runs_of(t, "");
  std::vector<const std::byte*> chunks;
  EXPECT_FALSE(follower_->load(runs, &chunks));
  follower_->after_pass();
  // Nothing of it was published with unwritten chunks: not even its first two.
  runs[0].count = 2;
  runs[0].last_hash = chain(t)[1];
  chunks.clear();
  EXPECT_FALSE(follower_->load(runs, &chunks));
}

TEST_F(RankStoreTest, AFollowerLackingTheEarlierTurnGivesItsSaveBack) {
  // Rank 0 holds the conversation's first turn, the follower lost it: the second turn's save
  // covers its blocks from 2 on at rank 0 and from 0 at the follower, whose chunks 0 and 1 no
  // pass writes.
  const std::vector<TokenId> t = tokens(7, 5 * store::kBlock + 1);
  ASSERT_TRUE(store::save(*leader_, std::span(t).first(2 * store::kBlock + 1), "s").ok());
  save_turn(t, "s", 4);
  std::vector<store::StoredRun> runs = runs_of(t, "s");
  ASSERT_EQ(runs.size(), 1u);
  ASSERT_EQ(runs[0].count, 5);
  std::vector<const std::byte*> chunks;
  EXPECT_FALSE(follower_->load(runs, &chunks));
}

TEST_F(RankStoreTest, ALookupIsCutToWhatEveryRankHolds) {
  // Both ranks hold the conversation's first 3 chunks; rank 0 alone saved 2 more (the other
  // rank had not written them yet).
  const std::vector<TokenId> t = tokens(8, 5 * store::kBlock + 1);
  save_turn(std::vector<TokenId>(t.begin(), t.begin() + 3 * store::kBlock + 1), "", 3);
  ASSERT_TRUE(store::save(*leader_, t).ok());
  std::optional<store::StoreMatch> m = leader_->find(t, store::root(), "");
  ASSERT_TRUE(m.has_value());
  ASSERT_EQ(m->num_chunks, 5);
  std::optional<store::StoredRun> run = leader_->describe_run(m->item, 0, 5);
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(feed_.held_by_all(*run, leader_->chunk_hashes(m->item, 5)), 3);
  // A conversation the other rank never saw: nothing.
  const std::vector<TokenId> u = tokens(9, 2 * store::kBlock + 1);
  ASSERT_TRUE(store::save(*leader_, u).ok());
  m = leader_->find(u, store::root(), "");
  ASSERT_TRUE(m.has_value());
  run = leader_->describe_run(m->item, 0, m->num_chunks);
  EXPECT_EQ(feed_.held_by_all(*run, leader_->chunk_hashes(m->item, m->num_chunks)), 0);
}

TEST_F(RankStoreTest, AnAbortedSaveAndAnErasedSessionLeaveNothing) {
  const std::vector<TokenId> t = tokens(5, 3 * store::kBlock + 1);
  save_turn(t, "kept", 3);
  std::vector<store::StoredRun> runs = runs_of(t, "kept");
  feed_.erase_session("kept");
  ASSERT_TRUE(follower_->apply(feed_.take_events()).ok());
  std::vector<const std::byte*> chunks;
  EXPECT_FALSE(follower_->load(runs, &chunks));  // a session's item is found by session only

  const std::vector<TokenId> u = tokens(6, 2 * store::kBlock + 1);
  const std::vector<kv::ChunkHash> hashes = chain(u);
  feed_.begin_save(SeqId{12}, {"", true, 0, hashes});
  ASSERT_TRUE(follower_->apply(feed_.take_events()).ok());
  std::vector<std::byte*> mine(2);
  follower_->save(SeqId{12}, 0, &mine);
  feed_.end_save(SeqId{12}, store::SaveEnd::kAbort);
  ASSERT_TRUE(follower_->apply(feed_.take_events()).ok());
  store::StoredRun run{"", hashes[1], 0, 2, 0, 0, true};
  chunks.clear();
  EXPECT_FALSE(follower_->load(std::span(&run, 1), &chunks));
}

TEST_F(RankStoreTest, MalformedEventsAreRefused) {
  feed_.end_save(kSeq, store::SaveEnd::kCommit);
  std::string events = feed_.take_events();
  EXPECT_EQ(follower_->apply(events.substr(0, events.size() - 1)).code(), StatusCode::kInternal);
  EXPECT_EQ(follower_->apply(std::string(1, '\x7f')).code(), StatusCode::kInternal);
  EXPECT_TRUE(follower_->apply(events).ok());  // a save it never began: nothing to end
}

TEST_F(RankStoreTest, AFollowersStoreNumbersReachRankZero) {
  const std::vector<TokenId> t = tokens(10, 3 * store::kBlock + 1);
  save_turn(t, "", 3);
  const store::StoreStats mine = follower_->stats();
  ASSERT_EQ(mine.tiers.size(), 1u);  // DRAM
  ASSERT_EQ(mine.tiers[0].chunks, 3);
  // Two other ranks report: this follower, and one without a store (zeros).
  std::vector<int64_t> rows = stats_row(mine);
  rows.resize(2 * kStatsRow, 0);
  feed_.set_rank_rows(rows);
  const std::vector<store::StoreStats> ranks = feed_.rank_stats();
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(ranks[0].tiers.size(), 1u);
  EXPECT_EQ(ranks[0].tiers[0].chunks, 3);
  EXPECT_EQ(ranks[0].tiers[0].used_bytes, mine.tiers[0].used_bytes);
  EXPECT_EQ(ranks[0].tiers[0].capacity_bytes, mine.tiers[0].capacity_bytes);
  EXPECT_TRUE(ranks[0].tiers[0].available);
  EXPECT_EQ(ranks[0].items, 1);
  EXPECT_TRUE(ranks[1].tiers.empty());
}

TEST(RankOptionsTest, EachRankHasItsDirectoriesTagAndAsManyChunks) {
  test_util::TempDir dir;
  store::StoreOptions base = store::options(&dir, 10, 20);
  base.remote = store::RedisOptions{
      .name = "remote", .address = "127.0.0.1:1", .capacity_bytes = 3000, .max_item_bytes = 300};
  store::StoreOptions one = base;
  store::make_rank_options(&one, 0, 1, 3, 3);
  EXPECT_EQ(one.layout_tag, base.layout_tag);  // one rank: unchanged
  EXPECT_EQ(one.tiers[0].dir, base.tiers[0].dir);
  std::vector<uint64_t> tags;
  for (int32_t rank = 0; rank < 2; ++rank) {
    const int64_t heads = rank == 0 ? 1 : 2;  // 3 KV heads over 2 ranks
    store::StoreOptions o = base;
    // (rank 0's side computes the same)
    FollowerFeed feed(shard_of(rank, 2, heads, 2), [](std::string, int64_t) { return 0; });
    feed.rank_options(&o);
    EXPECT_EQ(o.tiers[0].dir, base.tiers[0].dir + "/tp2-rank" + std::to_string(rank));
    EXPECT_EQ(o.dram_bytes, base.dram_bytes / 2 * heads);
    EXPECT_EQ(o.tiers[0].capacity_bytes, base.tiers[0].capacity_bytes / 2 * heads);
    EXPECT_EQ(o.remote->capacity_bytes, 3000 / 2 * heads);
    EXPECT_EQ(o.remote->max_item_bytes, 300 / 2 * heads);
    EXPECT_NE(o.layout_tag, base.layout_tag);
    tags.push_back(o.layout_tag);
  }
  EXPECT_NE(tags[0], tags[1]);
}

}  // namespace
}  // namespace strata::executor
