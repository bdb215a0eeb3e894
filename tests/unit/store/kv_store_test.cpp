// The KV store on real files: save / find / load round trips, extension of a conversation,
// session-keyed truncated items, demotion to SSD and scheduler-aware prefetching, restart
// recovery, and faults (corrupt, torn or missing chunks, a torn journal, kill -9 during saves,
// a disk that stops taking writes). Chunks hold a byte pattern derived from their hash, so every
// served chunk is checked for the right content, not just for a passing checksum.
#include "strata/store/kv_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "store_test_util.h"

namespace strata::store {
namespace {

TEST(KvStoreTest, SavesFindsAndLoadsTheLongestStoredPrefix) {
  auto store = KvStore::open(options(nullptr, 16)).value();
  const std::vector<TokenId> conv = tokens(1, 14);  // 3 full blocks + 2 tokens
  ASSERT_TRUE(save(*store, conv).ok());

  std::vector<TokenId> next = conv;
  next.insert(next.end(), {5, 6, 7});
  std::optional<StoreMatch> m = load_and_check(*store, next);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 3);
  EXPECT_TRUE(m->exact);
  EXPECT_EQ(m->tier, kDramTier);

  // One token is always left to compute: a 12-token prompt matches 2 chunks.
  EXPECT_EQ(store->find(std::span(conv).first(12), root(), {})->num_chunks, 2);
  // A prompt diverging in block 1 matches block 0 only.
  std::vector<TokenId> diverged = conv;
  diverged[5] = 99999;
  EXPECT_EQ(store->find(diverged, root(), {})->num_chunks, 1);
  // Another tenant (another root) finds nothing.
  EXPECT_FALSE(store->find(next, kv::chain_hash(root(), std::span(conv).first(kBlock)), {}));
  EXPECT_EQ(store->stats().tier("dram").hits, 1);
}

TEST(KvStoreTest, ANextTurnExtendsTheSameItem) {
  auto store = KvStore::open(options(nullptr, 16)).value();
  const std::vector<TokenId> turn1 = tokens(2, 8);
  ASSERT_TRUE(save(*store, turn1).ok());
  std::vector<TokenId> turn2 = turn1;
  for (TokenId t : tokens(3, 9)) turn2.push_back(t);
  SaveRequest request{"", true, 0, chain(turn2)};
  SaveTicket ticket = store->begin_save(request).value();
  EXPECT_EQ(ticket.first_chunk, 2);  // chunks 0-1 are stored already
  EXPECT_EQ(ticket.destinations.size(), 2u);
  for (size_t i = 0; i < ticket.destinations.size(); ++i) fill(ticket.destinations[i], request.chain[2 + i]);
  const ItemId item = ticket.item;
  store->commit_save(std::move(ticket), nullptr, 0);
  std::vector<TokenId> turn3 = turn2;
  turn3.push_back(1);
  std::optional<StoreMatch> m = load_and_check(*store, turn3);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->item, item);
  EXPECT_EQ(m->num_chunks, 4);
  EXPECT_EQ(store->stats().items, 1);
}

TEST(KvStoreTest, TruncatedItemsAreFoundBySessionOnly) {
  auto store = KvStore::open(options(nullptr, 16)).value();
  const std::vector<TokenId> conv = tokens(4, 20);
  // The turn ran on conv[0:4] + conv[12:] (8 tokens after the first block dropped, the rest
  // re-rotated): not exact.
  ASSERT_TRUE(save(*store, conv, "alice", /*exact=*/false, /*offset=*/8).ok());
  std::vector<TokenId> next = conv;
  next.push_back(3);
  EXPECT_FALSE(store->find(next, root(), {}));
  std::optional<StoreMatch> m = store->find(next, root(), "alice");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->token_offset, 8);
  EXPECT_FALSE(m->exact);
  EXPECT_EQ(m->num_chunks, 3);
  EXPECT_TRUE(store->erase_session("alice"));
  EXPECT_FALSE(store->find(next, root(), "alice"));
  EXPECT_EQ(store->stats().items, 0);
}

TEST(KvStoreTest, SaveWithoutDramRoomIsSkippedNotBlocked) {
  auto store = KvStore::open(options(nullptr, 2)).value();
  ASSERT_TRUE(save(*store, tokens(5, 8)).ok());
  const Status status = save(*store, tokens(6, 8));
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store->stats().saves_skipped, 1);
}

TEST(KvStoreTest, ASaveWithRoomForSomeChunksKeepsTheLeadingOnes) {
  auto store = KvStore::open(options(nullptr, 3)).value();
  ASSERT_TRUE(save(*store, tokens(5, 8)).ok());    // 2 chunks
  const std::vector<TokenId> long_prompt = tokens(6, 17);
  ASSERT_TRUE(save(*store, long_prompt).ok());     // 4 chunks wanted, room for 1
  EXPECT_EQ(store->stats().saves_partial, 1);
  std::optional<StoreMatch> m = load_and_check(*store, long_prompt);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 1);
}

TEST(KvStoreTest, ItemsUnusedForTheTtlExpire) {
  StoreOptions o = options(nullptr, 8);
  o.ttl = std::chrono::seconds(1);
  auto store = KvStore::open(o).value();
  ASSERT_TRUE(save(*store, tokens(8, 8)).ok());
  EXPECT_EQ(store->stats().items, 1);
  for (int i = 0; i < 40 && store->stats().expired == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(store->stats().expired, 1);
  EXPECT_EQ(store->stats().items, 0);
  EXPECT_EQ(store->stats().tier("dram").used_bytes, 0);
}

TEST(KvStoreTest, ASaveGrowsWithItsSequenceAndPublishesAtCommit) {
  auto store = KvStore::open(options(nullptr, 5)).value();
  const std::vector<TokenId> prompt = tokens(12, 8);  // 2 blocks
  std::vector<TokenId> turn = prompt;
  for (TokenId t : tokens(13, 16)) turn.push_back(t);  // 6 blocks in all
  const std::vector<kv::ChunkHash> hashes = chain(turn);
  SaveTicket ticket =
      store
          ->begin_save(
              {"s", true, 0, std::vector<kv::ChunkHash>(hashes.begin(), hashes.begin() + 2)})
          .value();
  ASSERT_EQ(ticket.destinations.size(), 2u);
  // Blocks the sequence computes later join the same ticket.
  EXPECT_EQ(store->extend_save(&ticket, std::span(hashes).subspan(2, 2)), 2);
  // Unpublished chunks are not found.
  EXPECT_FALSE(store->find(turn, root(), "s"));
  // DRAM has room for one of the next two: partial.
  EXPECT_EQ(store->extend_save(&ticket, std::span(hashes).subspan(4, 2)), 1);
  EXPECT_EQ(store->stats().saves_partial, 1);
  ASSERT_EQ(ticket.destinations.size(), 5u);
  for (size_t i = 0; i < 5; ++i) fill(ticket.destinations[i], hashes[i]);
  store->commit_save(std::move(ticket), nullptr, 0.25);
  std::optional<StoreMatch> m = load_and_check(*store, turn);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 5);
  EXPECT_EQ(store->stats().tier("dram").saves, 1);
  EXPECT_DOUBLE_EQ(store->stats().tier("dram").save_seconds, 0.25);
}

TEST(KvStoreTest, ASaveWithNothingNewExtendsItsItemWhileItEndsThere) {
  auto store = KvStore::open(options(nullptr, 8)).value();
  const std::vector<TokenId> turn = tokens(14, 13);  // 3 blocks + 1 token
  const std::vector<kv::ChunkHash> hashes = chain(turn);
  ASSERT_TRUE(save(*store, std::span(turn).first(8), "s").ok());
  // Everything asked is stored: no destinations, and the item still ends where the ticket does.
  SaveTicket ticket = store->begin_save({"s", true, 0, {hashes[0], hashes[1]}}).value();
  EXPECT_TRUE(ticket.destinations.empty());
  EXPECT_EQ(ticket.first_chunk, 2);
  EXPECT_EQ(store->extend_save(&ticket, std::span(hashes).subspan(2, 1)), 1);
  // An aborted extension leaves the item as it was.
  store->abort_save(ticket);
  EXPECT_EQ(store->find(turn, root(), "s")->num_chunks, 2);
  // Not once the item has grown past the ticket, nor after it left the store.
  SaveTicket stale = store->begin_save({"s", true, 0, {hashes[0], hashes[1]}}).value();
  ASSERT_TRUE(save(*store, turn, "s").ok());
  EXPECT_EQ(store->extend_save(&stale, std::span(hashes).subspan(2, 1)), 0);
  ASSERT_TRUE(store->erase_session("s"));
  SaveTicket gone{stale.item, 3, {}, {}};
  EXPECT_EQ(store->extend_save(&gone, std::span(hashes).subspan(2, 1)), 0);
}

// Truncated history is reachable by session only: if the session ends while the save runs, the
// published item could never be found, so it leaves the store.
TEST(KvStoreTest, ATruncatedSaveWhoseSessionEndedIsDroppedAtCommit) {
  auto store = KvStore::open(options(nullptr, 8)).value();
  const std::vector<TokenId> conv = tokens(15, 17);  // block 0, 8 dropped, then 1 block
  SaveRequest request{"s", false, 8, chain(conv, 8)};
  SaveTicket ticket = store->begin_save(request).value();
  ASSERT_EQ(ticket.destinations.size(), 2u);
  ASSERT_TRUE(store->erase_session("s"));  // the pending item stays until its save ends
  for (size_t i = 0; i < ticket.destinations.size(); ++i)
    fill(ticket.destinations[i], request.chain[i]);
  store->commit_save(std::move(ticket), nullptr, 0);
  EXPECT_EQ(store->stats().items, 0);
  EXPECT_EQ(store->stats().tier("dram").used_bytes, 0);
}

TEST(KvStoreTest, AsynchronousCommitPublishesAfterTheDataIsWritten) {
  auto store = KvStore::open(options(nullptr, 8)).value();
  const std::vector<TokenId> conv = tokens(7, 9);
  SaveRequest request{"", true, 0, chain(conv)};
  SaveTicket ticket = store->begin_save(request).value();
  std::vector<std::byte*> destinations = ticket.destinations;
  std::atomic<bool> written = false;
  store->commit_save(
      std::move(ticket),
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a device copy in flight
        for (size_t i = 0; i < destinations.size(); ++i) fill(destinations[i], request.chain[i]);
        written = true;
      },
      0.001);
  store->wait_idle();
  EXPECT_TRUE(written);
  EXPECT_TRUE(load_and_check(*store, conv));
}

TEST(KvStoreTest, DemotesToSsdAndPrefetchesQueuedConversations) {
  TempDir dir;
  StoreOptions o = options(&dir, 4, 64);
  o.dram_reserve_fraction = 0.25;  // keep one chunk free
  auto store = KvStore::open(o).value();
  const std::vector<TokenId> a = tokens(10, 9), b = tokens(11, 9);
  ASSERT_TRUE(save(*store, a).ok());
  ASSERT_TRUE(save(*store, b).ok());  // DRAM full: the least recently used (a) goes to SSD
  store->wait_idle();
  EXPECT_EQ(store->find(a, root(), {})->tier, kSsd);
  EXPECT_EQ(store->find(b, root(), {})->tier, kDramTier);
  EXPECT_EQ(store->stats().tier("dram").evictions, 1);
  // Pre-loading pins only what DRAM holds now, without reading the disk.
  EXPECT_FALSE(store->try_acquire_in_dram(store->find(a, root(), {})->item, 0, 2));
  std::optional<StoreLease> pinned =
      store->try_acquire_in_dram(store->find(b, root(), {})->item, 0, 2);
  ASSERT_TRUE(pinned);
  EXPECT_TRUE(holds(pinned->chunks[1], chain(b)[1]));
  EXPECT_FALSE(store->try_acquire_in_dram(pinned->item, 0, 3)) << "the item has 2 chunks";
  store->release(*pinned, 0);

  // a's job is queued: it is fetched into DRAM, and b (no queued job) makes room.
  store->set_queue({store->find(a, root(), {})->item});
  store->wait_idle();
  EXPECT_EQ(store->stats().prefetches, 1);
  TierIndex served = kSsd;
  ASSERT_TRUE(load_and_check(*store, a, &served));
  EXPECT_EQ(served, kDramTier);
  EXPECT_EQ(store->find(b, root(), {})->tier, kSsd);
  ASSERT_TRUE(load_and_check(*store, b, &served));  // read from SSD on demand
  EXPECT_EQ(served, kSsd);
  const StoreStats stats = store->stats();
  EXPECT_EQ(stats.tier("ssd").hits, 1);
  EXPECT_EQ(stats.tier("ssd").bytes_in, 4 * kChunkBytes);
  EXPECT_GT(stats.tier("ssd").load_seconds, 0);
}

TEST(KvStoreTest, LruBaselineDoesNotPrefetch) {
  TempDir dir;
  StoreOptions o = options(&dir, 4, 64);
  o.dram_reserve_fraction = 0.25;
  o.policy = EvictionPolicy::kLru;
  auto store = KvStore::open(o).value();
  const std::vector<TokenId> a = tokens(12, 9), b = tokens(13, 9);
  ASSERT_TRUE(save(*store, a).ok());
  ASSERT_TRUE(save(*store, b).ok());
  store->wait_idle();
  store->set_queue({store->find(a, root(), {})->item});
  store->wait_idle();
  EXPECT_EQ(store->stats().prefetches, 0);
  EXPECT_EQ(store->find(a, root(), {})->tier, kSsd);
}

TEST(KvStoreTest, ACleanRestartFindsTheConversationsOnSsd) {
  TempDir dir;
  const std::vector<TokenId> a = tokens(20, 17), b = tokens(21, 6);
  {
    auto store = KvStore::open(options(&dir, 16, 64)).value();
    ASSERT_TRUE(save(*store, a).ok());
    ASSERT_TRUE(save(*store, b, "bob", false, 2).ok());
  }  // shutdown persists the DRAM-only items
  auto store = KvStore::open(options(&dir, 16, 64)).value();
  EXPECT_EQ(store->stats().items, 2);
  TierIndex served = kDramTier;
  std::optional<StoreMatch> m = load_and_check(*store, a, &served);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 4);
  EXPECT_EQ(served, kSsd);
  std::vector<TokenId> b_next = b;
  b_next.push_back(1);
  std::optional<StoreMatch> s = store->find(b_next, root(), "bob");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->token_offset, 2);
  EXPECT_FALSE(s->exact);

  // Another model's store (another layout tag) starts empty.
  store.reset();
  StoreOptions other = options(&dir, 16, 64);
  other.layout_tag = 8;
  EXPECT_EQ(KvStore::open(other).value()->stats().items, 0);
}

// Overwrites `bytes` bytes of data-000.bin at `offset`.
void scribble(const TempDir& dir, int64_t offset, int64_t bytes) {
  std::fstream f(dir.file("ssd/data-000.bin"), std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  const std::vector<char> junk(static_cast<size_t>(bytes), '\x5a');
  f.write(junk.data(), bytes);
}

TEST(KvStoreTest, CorruptTornOrMissingChunksAreDetectedAndCounted) {
  TempDir dir;
  const std::vector<TokenId> a = tokens(30, 9);
  for (const char* fault : {"corrupt", "torn", "missing"}) {
    {
      auto store = KvStore::open(options(&dir, 16, 64)).value();
      ASSERT_TRUE(save(*store, a).ok());
    }
    if (std::string(fault) == "corrupt") scribble(dir, 100, 1);            // one flipped byte
    if (std::string(fault) == "torn") scribble(dir, 8192 + 2048, 4096);    // a half-written chunk
    if (std::string(fault) == "missing") std::filesystem::remove(dir.file("ssd/data-000.bin"));
    auto store = KvStore::open(options(&dir, 16, 64)).value();
    std::optional<StoreMatch> m = store->find(a, root(), {});
    ASSERT_TRUE(m) << fault;
    StatusOr<StoreLease> lease = store->acquire(m->item, 0, m->num_chunks);
    EXPECT_EQ(lease.status().code(), StatusCode::kDataLoss) << fault;
    EXPECT_EQ(store->stats().corrupt_chunks, 1) << fault;
    EXPECT_FALSE(store->find(a, root(), {})) << fault << ": a corrupt item must be dropped";
  }
}

TEST(KvStoreTest, AnItemThatFailsWhilePinnedLeavesAtItsLastRelease) {
  TempDir dir;
  const std::vector<TokenId> a = tokens(10, 30);  // 7 chunks, slots of 8 KiB
  {
    auto store = KvStore::open(options(&dir, 16, 64)).value();
    ASSERT_TRUE(save(*store, a).ok());
  }
  scribble(dir, 5 * 8192 + 100, 1);  // chunk 5
  auto store = KvStore::open(options(&dir, 16, 64)).value();
  std::optional<StoreMatch> m = store->find(a, root(), {});
  ASSERT_TRUE(m);
  StatusOr<StoreLease> head = store->acquire(m->item, 0, 2);
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  const std::vector<std::byte> before(head->chunks[1], head->chunks[1] + kChunkBytes);
  EXPECT_EQ(store->acquire(m->item, 4, 3).status().code(), StatusCode::kDataLoss);
  // Unreachable at once, but the pinned chunks stay in place until released.
  EXPECT_FALSE(store->find(a, root(), {}));
  EXPECT_EQ(store->acquire(m->item, 0, 1).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(save(*store, tokens(11, 30)).ok());  // reuses free DRAM, never the pinned slots
  EXPECT_EQ(std::vector<std::byte>(head->chunks[1], head->chunks[1] + kChunkBytes), before);
  store->release(*head, 0);
  EXPECT_EQ(store->stats().items, 1);
}

// CachedAttention's fix for a DRAM tier smaller than the working set: a load DRAM has no room for
// reads its chunks from SSD into buffers the lease owns, for the device, instead of failing.
TEST(KvStoreTest, ALoadWithoutDramRoomReadsStraightFromSsd) {
  TempDir dir;
  const std::vector<TokenId> a = tokens(12, 9);  // 2 chunks
  {
    auto store = KvStore::open(options(&dir, 2, 16)).value();
    ASSERT_TRUE(save(*store, a).ok());
  }  // now only on SSD
  auto store = KvStore::open(options(&dir, 2, 16)).value();
  // Fills DRAM with an item not on SSD, so nothing can be reclaimed without I/O.
  ASSERT_TRUE(save(*store, tokens(13, 9), "filler").ok());
  const int64_t dram_used = store->stats().tier("dram").used_bytes;
  TierIndex served = kDramTier;
  std::optional<StoreMatch> loaded = load_and_check(*store, a, &served);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->num_chunks, 2);
  EXPECT_EQ(served, kSsd);
  const StoreStats stats = store->stats();
  EXPECT_EQ(stats.direct_loads, 1);
  EXPECT_EQ(stats.corrupt_chunks, 0);
  EXPECT_EQ(stats.tier("dram").used_bytes, dram_used) << "DRAM was not touched";
  EXPECT_EQ(stats.tier("ssd").hits, 1);
  // The item stays on SSD and loads again.
  ASSERT_TRUE(load_and_check(*store, a, &served));
  EXPECT_EQ(served, kSsd);
}

TEST(KvStoreTest, ATornJournalTailIsIgnored) {
  TempDir dir;
  const std::vector<TokenId> a = tokens(40, 9);
  {
    auto store = KvStore::open(options(&dir, 16, 64)).value();
    ASSERT_TRUE(save(*store, a).ok());
  }
  {
    std::ofstream journal(dir.file("ssd/index.journal"), std::ios::app | std::ios::binary);
    journal.write("\x40\x00\x00\x00\x02\x00\x00\x00partial", 15);  // a PUT cut short
  }
  auto store = KvStore::open(options(&dir, 16, 64)).value();
  EXPECT_TRUE(load_and_check(*store, a));
}

TEST(KvStoreTest, KillDuringSavesNeverServesACorruptChunk) {
  TempDir dir;
  constexpr int kConversations = 40;
  for (int round = 0; round < 3; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // Saves and demotions as fast as possible until killed.
      StoreOptions o = options(&dir, 6, 96);
      o.dram_reserve_fraction = 0.5;
      auto store = KvStore::open(o).value();
      for (int i = 0;; i = (i + 1) % kConversations) {
        (void)save(*store, tokens(100 + i, 4 + 4 * (i % 3)));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 70 * round));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));

    auto store = KvStore::open(options(&dir, 6, 96)).value();
    int recovered = 0;
    for (int i = 0; i < kConversations; ++i) {
      std::vector<TokenId> prompt = tokens(100 + i, 4 + 4 * (i % 3));
      prompt.push_back(1);
      std::optional<StoreMatch> m = store->find(prompt, root(), {});
      if (!m) continue;
      StatusOr<StoreLease> lease = store->acquire(m->item, 0, m->num_chunks);
      if (!lease.ok()) {
        EXPECT_EQ(lease.status().code(), StatusCode::kDataLoss);
        continue;
      }
      const std::vector<kv::ChunkHash> hashes = chain(prompt);
      for (int64_t c = 0; c < m->num_chunks; ++c) ASSERT_TRUE(holds(lease->chunks[c], hashes[c]));
      store->release(*lease, 0);
      ++recovered;
    }
    EXPECT_GT(recovered, 0) << "round " << round << ": nothing survived on SSD";
  }
}

TEST(KvStoreTest, AFullDiskDegradesToDramWithAWarning) {
  TempDir dir;
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto limit = [&](rlim_t bytes) {
    rlimit l = saved;
    l.rlim_cur = bytes;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &l), 0);
  };
  {
    // No room for even one data file: DRAM only from the start.
    limit(8192);
    auto store = KvStore::open(options(&dir, 4, 64)).value();
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
    EXPECT_FALSE(store->stats().tier("ssd").available);
    EXPECT_TRUE(save(*store, tokens(50, 8)).ok());
  }
  {
    // The disk stops taking writes while serving: demotion fails, the SSD tier is switched off,
    // DRAM keeps working.
    std::filesystem::remove_all(dir.file("ssd"));
    StoreOptions o = options(&dir, 4, 64);
    o.dram_reserve_fraction = 0.25;
    auto store = KvStore::open(o).value();
    ASSERT_TRUE(store->stats().tier("ssd").available);
    limit(0);
    ASSERT_TRUE(save(*store, tokens(51, 8)).ok());
    ASSERT_TRUE(save(*store, tokens(52, 8)).ok());
    store->wait_idle();
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
    const StoreStats stats = store->stats();
    EXPECT_FALSE(stats.tier("ssd").available);
    EXPECT_EQ(stats.tier("dram").evictions, 1);  // the victim left the store
    EXPECT_TRUE(load_and_check(*store, tokens(52, 8)));
    EXPECT_TRUE(save(*store, tokens(53, 4)).ok());
  }
}

}  // namespace
}  // namespace strata::store
