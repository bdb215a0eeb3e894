// The tier stack on real files: the zstd codec at the storage boundary (exact round trips, fewer
// bytes stored, corrupt input refused), a third tier that only the store's options name, and the
// SSD tier under injected file-system faults (torn writes, ENOSPC, EIO, failed fsync) through
// its Env: whatever fails, a load either returns the right bytes or fails, never wrong bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "store_test_util.h"
#include "support/fault_env.h"

namespace strata::store {
namespace {

using test_util::FaultEnv;
using Fault = FaultEnv::Fault;

// KV-like chunk bytes: float32 values whose low 16 bits are zero (bf16 activations held in an
// fp32 pool), different for every hash.
void fill_kv_like(std::byte* dst, const kv::ChunkHash& h) {
  uint64_t x = h.low ^ (h.high << 1) ^ 0x9E3779B97F4A7C15ULL;
  for (int64_t i = 0; i + 4 <= kChunkBytes; i += 4) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float v = static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) / 256.0f;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= 0xFFFF0000u;
    std::memcpy(dst + i, &bits, 4);
  }
  for (int64_t i = kChunkBytes / 4 * 4; i < kChunkBytes; ++i) dst[i] = std::byte{0};
}

Status save_kv_like(KvStore& store, std::span<const TokenId> t) {
  SaveRequest request{{}, true, 0, chain(t)};
  STRATA_ASSIGN_OR_RETURN(SaveTicket ticket, store.begin_save(request));
  for (size_t i = 0; i < ticket.destinations.size(); ++i) {
    fill_kv_like(ticket.destinations[i], request.chain[ticket.first_chunk + i]);
  }
  store.commit_save(std::move(ticket), nullptr, 0);
  return Status();
}

// Loads every chunk `t` has stored; true if the bytes are right, false if the load failed.
// A load that returns wrong bytes fails the test.
bool load_kv_like(KvStore& store, std::span<const TokenId> t, TierIndex* served = nullptr) {
  std::optional<StoreMatch> m = store.find(t, root(), {});
  if (!m) return false;
  StatusOr<StoreLease> lease = store.acquire(m->item, 0, m->num_chunks);
  if (!lease.ok()) return false;
  const std::vector<kv::ChunkHash> hashes = chain(t);
  std::vector<std::byte> want(kChunkBytes);
  for (int64_t i = 0; i < m->num_chunks; ++i) {
    fill_kv_like(want.data(), hashes[i]);
    EXPECT_EQ(std::memcmp(lease->chunks[i], want.data(), kChunkBytes), 0)
        << "chunk " << i << " was served with the wrong bytes";
  }
  if (served) *served = lease->served_from;
  store.release(*lease, 0);
  return true;
}

SsdOptions lower_tier(const TempDir& dir, const std::string& name, int64_t chunks,
                      CodecKind codec = CodecKind::kIdentity, Env* env = Env::posix()) {
  return {.name = name,
          .dir = dir.file(name),
          .capacity_bytes = chunks * 8192,
          .file_bytes = 16 * 8192,
          .codec = codec,
          .env = env};
}

// DRAM of 4 chunks, a quarter kept free: the second 2-chunk item sends the first one down.
StoreOptions stack(std::vector<SsdOptions> tiers) {
  StoreOptions o = options(nullptr, 4);
  o.dram_reserve_fraction = 0.25;
  o.tiers = std::move(tiers);
  return o;
}

TEST(CodecTest, ZstdRoundTripsExactlyAndRefusesCorruptInput) {
  std::vector<std::byte> raw(kChunkBytes), encoded, back(kChunkBytes);
  fill_kv_like(raw.data(), {1, 2});
  ASSERT_TRUE(encode(CodecKind::kZstd, raw, &encoded).ok());
  EXPECT_LT(encoded.size(), raw.size() * 3 / 4) << "bf16-valued floats compress";
  ASSERT_TRUE(decode(CodecKind::kZstd, encoded, back).ok());
  EXPECT_EQ(back, raw);
  // Flipped bytes inside the frame, a cut frame, or the wrong size never decode silently.
  std::vector<std::byte> cut(encoded.begin(), encoded.begin() + encoded.size() / 2);
  EXPECT_EQ(decode(CodecKind::kZstd, cut, back).code(), StatusCode::kDataLoss);
  std::vector<std::byte> shorter(kChunkBytes - 1);
  EXPECT_EQ(decode(CodecKind::kZstd, encoded, shorter).code(), StatusCode::kDataLoss);
  EXPECT_EQ(decode(CodecKind::kIdentity, shorter, back).code(), StatusCode::kDataLoss);
}

TEST(TierStackTest, AZstdSsdTierStoresFewerBytesAndLoadsTheSameChunks) {
  TempDir dir;
  auto store = KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kZstd)})).value();
  const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9);
  ASSERT_TRUE(save_kv_like(*store, a).ok());
  ASSERT_TRUE(save_kv_like(*store, b).ok());
  store->wait_idle();
  StoreStats stats = store->stats();
  EXPECT_EQ(stats.tier("ssd").codec, "zstd");
  EXPECT_EQ(stats.tier("ssd").chunks, 2);
  EXPECT_EQ(stats.tier("ssd").raw_bytes, 2 * kChunkBytes);
  EXPECT_LT(stats.tier("ssd").bytes_in, stats.tier("ssd").raw_bytes * 3 / 4);
  TierIndex served = kDramTier;
  ASSERT_TRUE(load_kv_like(*store, a, &served));
  EXPECT_EQ(served, kSsd);
  // After a restart the codec's values are found and decoded again.
  store.reset();
  store = KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kZstd)})).value();
  ASSERT_TRUE(load_kv_like(*store, a, &served));
  EXPECT_EQ(served, kSsd);
  // A tier reopened with another codec does not read values it cannot decode: it starts empty.
  store.reset();
  store = KvStore::open(stack({lower_tier(dir, "ssd", 64)})).value();
  EXPECT_FALSE(store->find(a, root(), {}));
}

// An emulated slower disk (kv_store.ssd_bandwidth_limit): a load from the tier takes at least
// its bytes' time at the limit, and returns the same bytes.
TEST(TierStackTest, ABandwidthLimitedSsdTierTakesItsBytesTimeAndServesTheSameChunks) {
  TempDir dir;
  SsdOptions ssd = lower_tier(dir, "ssd", 64);
  ssd.bandwidth_limit = 64 << 10;  // bytes per second
  auto store = KvStore::open(stack({ssd})).value();
  const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9);
  ASSERT_TRUE(save_kv_like(*store, a).ok());
  ASSERT_TRUE(save_kv_like(*store, b).ok());
  store->wait_idle();
  const auto start = std::chrono::steady_clock::now();
  TierIndex served = kDramTier;
  ASSERT_TRUE(load_kv_like(*store, a, &served));
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(served, kSsd);
  EXPECT_GE(took.count(), 2.0 * kChunkBytes / (64 << 10)) << "2 chunks read at 64 KiB/s";
  StoreOptions negative = stack({lower_tier(dir, "other", 64)});
  negative.tiers[0].bandwidth_limit = -1;
  EXPECT_EQ(KvStore::open(negative).status().code(), StatusCode::kInvalidArgument);
}

TEST(TierStackTest, AThirdTierIsNamedInTheOptionsOnly) {
  TempDir dir;
  // "ssd" holds one item; "archive" (zstd) holds every item demoted past it.
  auto store = KvStore::open(stack({lower_tier(dir, "ssd", 2),
                                    lower_tier(dir, "archive", 64, CodecKind::kZstd)}))
                   .value();
  ASSERT_EQ(store->num_tiers(), 3);
  const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9), c = tokens(3, 9);
  for (const auto& t : {a, b, c}) {
    ASSERT_TRUE(save_kv_like(*store, t).ok());
    store->wait_idle();
  }
  // a and b were demoted: both into "archive", only the later one still in "ssd".
  const StoreStats stats = store->stats();
  EXPECT_EQ(stats.tier("archive").chunks, 4);
  EXPECT_EQ(stats.tier("ssd").chunks, 2);
  EXPECT_EQ(stats.tier("ssd").evictions, 1);
  EXPECT_EQ(store->find(a, root(), {})->tier, 2) << "a is only in the third tier";
  EXPECT_EQ(store->find(b, root(), {})->tier, kSsd) << "b is nearest in the second";
  // (Each load fills DRAM and sets off a demotion that may evict b's "ssd" copy: b loads first.)
  TierIndex served = kDramTier;
  ASSERT_TRUE(load_kv_like(*store, b, &served));
  EXPECT_EQ(served, kSsd) << "the nearest tier holding a chunk serves it";
  ASSERT_TRUE(load_kv_like(*store, a, &served));
  EXPECT_EQ(served, 2);
  EXPECT_EQ(store->tier_name(served), "archive");
}

TEST(TierStackTest, ATornDataWriteIsCaughtByItsChecksum) {
  TempDir dir;
  FaultEnv env;
  auto store = KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kIdentity, &env)})).value();
  const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9);
  env.inject(Fault::kTornWrite, "data-");  // the first chunk demoted loses its second page
  ASSERT_TRUE(save_kv_like(*store, a).ok());
  ASSERT_TRUE(save_kv_like(*store, b).ok());
  store->wait_idle();
  EXPECT_EQ(env.remaining(), 0);
  EXPECT_FALSE(load_kv_like(*store, a)) << "the torn chunk is refused";
  EXPECT_EQ(store->stats().corrupt_chunks, 1);
  EXPECT_FALSE(store->find(a, root(), {})) << "and its item dropped";
  EXPECT_TRUE(load_kv_like(*store, b));
}

TEST(TierStackTest, WriteErrorsAndFailedSyncsFailTheTierAndLoseNoServedByte) {
  for (const auto& [fault, file] : {std::pair{Fault::kWriteError, "data-"},
                                   std::pair{Fault::kSyncError, "data-"},
                                   std::pair{Fault::kSyncError, "index.journal"},
                                   std::pair{Fault::kNoSpace, "index.journal"}}) {
    TempDir dir;
    FaultEnv env;
    auto store =
        KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kIdentity, &env)})).value();
    const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9), c = tokens(3, 9);
    env.inject(fault, file);
    ASSERT_TRUE(save_kv_like(*store, a).ok());
    ASSERT_TRUE(save_kv_like(*store, b).ok());  // a's demotion fails
    store->wait_idle();
    const std::string what = std::string(file) + " fault " + std::to_string(static_cast<int>(fault));
    EXPECT_FALSE(store->stats().tier("ssd").available) << what;
    EXPECT_FALSE(store->find(a, root(), {})) << what << ": a had nowhere to go";
    // The store goes on with DRAM alone.
    ASSERT_TRUE(save_kv_like(*store, c).ok()) << what;
    store->wait_idle();
    EXPECT_TRUE(load_kv_like(*store, c)) << what;
  }
}

TEST(TierStackTest, AReadErrorFailsTheLoadAndTheTier) {
  TempDir dir;
  FaultEnv env;
  auto store = KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kIdentity, &env)})).value();
  const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9), c = tokens(3, 9);
  for (const auto& t : {a, b, c}) {  // a and b are demoted: only on SSD
    ASSERT_TRUE(save_kv_like(*store, t).ok());
    store->wait_idle();
  }
  const std::optional<StoreMatch> found_b = store->find(b, root(), {});
  ASSERT_TRUE(found_b);
  ASSERT_EQ(found_b->tier, kSsd);
  env.inject(Fault::kReadError, "data-");
  EXPECT_FALSE(load_kv_like(*store, a));
  EXPECT_FALSE(store->stats().tier("ssd").available);
  EXPECT_EQ(store->stats().corrupt_chunks, 1);
  // b's chunks are only in the failed tier: a lookup no longer offers them, and a load found
  // before the failure fails without touching the disk (and drops b).
  EXPECT_FALSE(store->find(b, root(), {}));
  EXPECT_EQ(store->acquire(found_b->item, 0, found_b->num_chunks).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(store->stats().corrupt_chunks, 2);
  EXPECT_TRUE(load_kv_like(*store, c)) << "DRAM still serves";
}

// A conversation's item that a save is still growing (a turn DRAM was short for publishes in
// pieces) fails a load: it becomes unreachable at once and leaves when the save publishes,
// instead of under it.
TEST(TierStackTest, AnItemASaveStillGrowsLeavesAfterTheSaveWhenItsLoadFails) {
  TempDir dir;
  FaultEnv env;
  auto store =
      KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kIdentity, &env)})).value();
  const std::vector<TokenId> a = tokens(1, 13);  // 3 chunks
  const std::vector<TokenId> head(a.begin(), a.begin() + 8);
  for (const auto& t : {head, tokens(2, 9), tokens(3, 9)}) {  // head is demoted: only on SSD
    ASSERT_TRUE(save_kv_like(*store, t).ok());
    store->wait_idle();
  }
  const std::optional<StoreMatch> found = store->find(a, root(), {});
  ASSERT_TRUE(found);
  ASSERT_EQ(found->num_chunks, 2);
  ASSERT_EQ(found->tier, kSsd);
  const SaveRequest request{{}, true, 0, chain(a)};
  SaveTicket ticket = store->begin_save(request).value();
  ASSERT_EQ(ticket.item, found->item) << "the save grows the stored item";
  ASSERT_EQ(ticket.first_chunk, 2);
  ASSERT_EQ(ticket.destinations.size(), 1u);
  env.inject(Fault::kReadError, "data-");
  EXPECT_EQ(store->acquire(found->item, 0, 2).status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(store->find(a, root(), {}));
  fill_kv_like(ticket.destinations[0], request.chain[2]);
  store->commit_save(std::move(ticket), nullptr, 0);
  store->wait_idle();
  EXPECT_FALSE(store->find(a, root(), {}));
  EXPECT_EQ(store->stats().items, 2);
}

TEST(TierStackTest, AFailedDropFailsTheTierAndTheItemStillLeaves) {
  TempDir dir;
  FaultEnv env;
  auto store = KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kIdentity, &env)})).value();
  const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9);
  ASSERT_TRUE(save(*store, a, "conversation").ok());
  ASSERT_TRUE(save_kv_like(*store, b).ok());  // a is demoted to SSD
  store->wait_idle();
  ASSERT_EQ(store->find(a, root(), {})->tier, kSsd);
  env.inject(Fault::kWriteError, "index.journal");  // the DROP record cannot be written
  EXPECT_TRUE(store->erase_session("conversation"));
  EXPECT_EQ(env.remaining(), 0);
  EXPECT_FALSE(store->stats().tier("ssd").available);
  EXPECT_FALSE(store->find(a, root(), {})) << "the item left the store all the same";
  EXPECT_TRUE(load_kv_like(*store, b)) << "DRAM still serves";
}

TEST(TierStackTest, LowerTiersNeedDistinctNamesAndDirectories) {
  TempDir dir;
  EXPECT_EQ(KvStore::open(stack({lower_tier(dir, "ssd", 8), lower_tier(dir, "ssd", 8)})).status().code(),
            StatusCode::kInvalidArgument);
  SsdOptions same_dir = lower_tier(dir, "archive", 8);
  same_dir.dir = dir.file("ssd");
  EXPECT_EQ(KvStore::open(stack({lower_tier(dir, "ssd", 8), same_dir})).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TierStackTest, ADiskWithoutRoomAtOpenLeavesADramOnlyStore) {
  TempDir dir;
  FaultEnv env;
  env.inject(Fault::kNoSpace, "data-");
  auto store = KvStore::open(stack({lower_tier(dir, "ssd", 64, CodecKind::kIdentity, &env)})).value();
  EXPECT_EQ(store->num_tiers(), 1);
  EXPECT_FALSE(store->stats().tier("ssd").available);
  const std::vector<TokenId> a = tokens(1, 9);
  ASSERT_TRUE(save_kv_like(*store, a).ok());
  EXPECT_TRUE(load_kv_like(*store, a));
}

// A deployment's configured SSD tier (StoreOptions::from_config marks it required) that cannot be
// used fails start-up with its directory named, instead of a warning and a DRAM-only store.
TEST(TierStackTest, AConfiguredTierThatCannotBeUsedFailsTheStart) {
  TempDir dir;
  FaultEnv env;
  env.inject(Fault::kNoSpace, "data-");
  SsdOptions ssd = lower_tier(dir, "ssd", 64, CodecKind::kIdentity, &env);
  ssd.required = true;
  const Status status = KvStore::open(stack({ssd})).status();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find(ssd.dir), std::string::npos) << status.message();
  StoreConfig config;
  config.dram_bytes = 1 << 20;
  config.ssd_dir = dir.file("x");
  config.ssd_bytes = 1 << 20;
  EXPECT_TRUE(StoreOptions::from_config(config).tiers.at(0).required);
}

}  // namespace
}  // namespace strata::store
