// The store's lossy item codecs (store/item_codecs.h) with a stand-in transcoder that keeps a
// prefix of each chunk's bytes (the real KIVI transcoder is the executor's, tested there):
// a fixed codec re-encodes every item in DRAM (one a save grows in pieces once the save ends),
// encoded items demote, load and survive a restart with their codec, a deployment without the
// codec leaves them out, a new turn replaces an encoded item with a raw one, and AdaptCache's
// greedy compresses hot items in DRAM before it demotes cold ones (or keeps them whole when
// quality is worth more than delay) and chooses only among profiled codecs, weighing each item
// by its task family's quality (which the SSD journal keeps). Token dropping (StreamingLLM)
// keeps an item's first chunk and its most recent ones, found by content or session at their
// chain links, across a restart, and a save that continues the links rolls forward. Krul's
// layer merge applies only to conversations with their layer pairs, which the transcoder and
// loads receive and the SSD journal keeps. H2O applies only to conversations with their token
// mass, and its kept chunks (and a later turn's item resuming them) load only all together,
// which the SSD journal keeps.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "store_test_util.h"
#include "strata/store/ssd_tier.h"

namespace strata::store {
namespace {

constexpr int64_t kHalf = kChunkBytes / 2, kQuarter = kChunkBytes / 4;

// codecs[1] "half" keeps the first half of a raw chunk, codecs[2] "quarter" the first quarter.
StoreOptions with_codecs(StoreOptions o) {
  o.codecs = {{.name = "half", .chunk_bytes = kHalf, .quality = 0.99, .task_quality = {}},
              {.name = "quarter", .chunk_bytes = kQuarter, .quality = 0.9, .task_quality = {}}};
  o.transcode = [](int32_t from, int32_t to, const std::vector<kv::krul::LayerPair>&,
                   std::span<const std::byte* const> in, std::span<std::byte* const> out) {
    const int64_t sizes[] = {kChunkBytes, kHalf, kQuarter};
    if (sizes[to] > sizes[from]) return invalid_argument_error("prefixes only shrink");
    for (size_t i = 0; i < in.size(); ++i) std::memcpy(out[i], in[i], sizes[to]);
    return Status();
  };
  return o;
}

// Loads every matched chunk of `prompt`: its codec, and its bytes against the prefix the codec
// keeps.
int32_t load_encoded(KvStore& store, std::span<const TokenId> prompt,
                     const std::string& session = {}) {
  std::optional<StoreMatch> m = store.find(prompt, root(), session);
  EXPECT_TRUE(m.has_value());
  if (!m) return -1;
  StatusOr<StoreLease> lease = store.acquire(m->item, 0, m->num_chunks);
  EXPECT_TRUE(lease.ok()) << lease.status().to_string();
  if (!lease.ok()) return -1;
  const int64_t bytes[] = {kChunkBytes, kHalf, kQuarter};
  const std::vector<kv::ChunkHash> hashes = chain(prompt);
  for (int64_t i = 0; i < m->num_chunks; ++i) {
    std::vector<std::byte> want(kChunkBytes);
    fill(want.data(), hashes[i]);
    EXPECT_EQ(std::memcmp(lease->chunks[i], want.data(), bytes[lease->codec]), 0) << "chunk " << i;
  }
  const int32_t codec = lease->codec;
  store.release(*lease, 0);
  return codec;
}

TEST(KvStoreCodecsTest, AFixedCodecReencodesEveryItemInDram) {
  StoreOptions o = with_codecs(options(nullptr, 16));
  o.fixed_codec = 2;
  auto store = KvStore::open(o).value();
  const std::vector<TokenId> conv = tokens(1, 13);
  ASSERT_TRUE(save(*store, conv).ok());
  store->wait_idle();
  const StoreStats s = store->stats();
  EXPECT_EQ(s.transcodes, 1);
  EXPECT_EQ(s.codec_items, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(s.tier("dram").used_bytes, 3 * 4096);  // a page per quarter chunk, not two
  EXPECT_EQ(load_encoded(*store, conv), 2);
}

TEST(KvStoreCodecsTest, AnItemSavedInPiecesIsReencodedOnlyOnceItsSaveEnds) {
  StoreOptions o = with_codecs(options(nullptr, 16));
  o.fixed_codec = 2;
  auto store = KvStore::open(o).value();
  // Each conversation saves its first 2 chunks, goes on with a continuation ticket and, for
  // `whole`, grows the item by 2 more before it commits; the other aborts the continuation.
  for (const bool whole : {true, false}) {
    const std::vector<TokenId> conv = tokens(whole ? 1 : 2, 17);
    const std::vector<kv::ChunkHash> hashes = chain(conv);
    const int64_t transcodes = store->stats().transcodes;
    SaveTicket ticket =
        store->begin_save({{}, true, 0, {hashes.begin(), hashes.begin() + 2}}).value();
    for (int64_t i = 0; i < 2; ++i) fill(ticket.destinations[i], hashes[i]);
    SaveTicket next = store->continue_save(std::move(ticket), nullptr, 0);
    EXPECT_EQ(next.first_chunk, 2);
    EXPECT_TRUE(next.destinations.empty());
    store->wait_idle();
    EXPECT_EQ(store->stats().transcodes, transcodes) << "re-encoded between the save's pieces";
    if (whole) {
      ASSERT_EQ(store->extend_save(&next, std::span(hashes).subspan(2, 2)), 2);
      for (int64_t i = 0; i < 2; ++i) fill(next.destinations[i], hashes[2 + i]);
      store->commit_save(std::move(next), nullptr, 0);
    } else {
      store->abort_save(next);
    }
    store->wait_idle();
    EXPECT_EQ(store->stats().transcodes, transcodes + 1) << "the codec applies once the save ends";
    EXPECT_EQ(store->find(conv, root(), {})->num_chunks, whole ? 4 : 2);
    EXPECT_EQ(load_encoded(*store, conv), 2);
  }
}

TEST(KvStoreCodecsTest, EncodedItemsDemoteLoadAndSurviveARestartWithTheirCodec) {
  TempDir dir;
  StoreOptions o = with_codecs(options(&dir, 5, 16));  // 10 pages
  o.fixed_codec = 1;
  o.dram_reserve_fraction = 0.5;  // demote below 3 free chunks
  o.policy = EvictionPolicy::kLru;
  const std::vector<TokenId> a = tokens(2, 13), b = tokens(3, 13);
  {
    auto store = KvStore::open(o).value();
    ASSERT_TRUE(save(*store, a).ok());
    store->wait_idle();
    ASSERT_TRUE(save(*store, b).ok());  // then 6 of 10 pages are used: a, the older, goes down
    store->wait_idle();
    EXPECT_EQ(store->stats().transcodes, 2);
    std::optional<StoreMatch> m = store->find(a, root(), {});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->tier, kSsd);
    EXPECT_EQ(load_encoded(*store, a), 1);
  }
  {
    auto store = KvStore::open(o).value();  // clean shutdown persisted both, encoded
    EXPECT_EQ(store->stats().codec_items, (std::vector<int64_t>{0, 2, 0}));
    EXPECT_EQ(load_encoded(*store, a), 1);
    EXPECT_EQ(load_encoded(*store, b), 1);
  }
  StoreOptions without = options(&dir, 4, 16);  // a deployment without "half"
  auto store = KvStore::open(without).value();
  EXPECT_EQ(store->stats().items, 0);
  EXPECT_FALSE(store->find(a, root(), {}));
}

TEST(KvStoreCodecsTest, ANewTurnReplacesAnEncodedItemWithARawOne) {
  StoreOptions o = with_codecs(options(nullptr, 16));
  o.fixed_codec = 1;
  auto store = KvStore::open(o).value();
  const std::vector<TokenId> turn1 = tokens(4, 9);
  ASSERT_TRUE(save(*store, turn1, "s").ok());
  store->wait_idle();
  std::vector<TokenId> turn2 = turn1;
  for (TokenId t : tokens(5, 8)) turn2.push_back(t);
  SaveRequest request{"s", true, 0, chain(turn2)};
  SaveTicket ticket = store->begin_save(request).value();
  EXPECT_EQ(ticket.first_chunk, 0);  // raw chunks do not extend encoded ones
  EXPECT_EQ(ticket.destinations.size(), 4u);
  for (size_t i = 0; i < ticket.destinations.size(); ++i)
    fill(ticket.destinations[i], request.chain[i]);
  store->commit_save(std::move(ticket), nullptr, 0);
  store->wait_idle();
  EXPECT_EQ(store->stats().items, 1);  // the encoded item was superseded and dropped
  EXPECT_EQ(load_encoded(*store, turn2, "s"), 1);
}

TEST(KvStoreCodecsTest, SavesFitTheFreePagesThatSmallerValuesLeaveInPieces) {
  // Raw chunks take 2 pages, halves 1: re-encoding leaves the free pages in pieces, and a save
  // must count the raw chunks that fit whole (counting free pages, it once failed to reserve
  // them and aborted).
  StoreOptions o = with_codecs(options(nullptr, 16));
  o.fixed_codec = 1;
  o.dram_reserve_fraction = 0.25;
  o.policy = EvictionPolicy::kLru;
  auto store = KvStore::open(o).value();
  std::mt19937 rng(9);
  for (int i = 0; i < 300; ++i) {
    const std::vector<TokenId> conv = tokens(1000 + i, 5 + static_cast<int64_t>(rng() % 36));
    const Status saved = save(*store, conv);
    ASSERT_TRUE(saved.ok() || saved.code() == StatusCode::kResourceExhausted) << saved.to_string();
    if (rng() % 2 == 0) store->wait_idle();
  }
  store->wait_idle();
  const StoreStats s = store->stats();
  EXPECT_GT(s.transcodes, 100);
  EXPECT_LE(s.tier("dram").used_bytes, s.tier("dram").capacity_bytes);
}

// AdaptCache over DRAM (fast) and SSD (slow): 6 items of 3 chunks; DRAM of 12 raw chunks keeps 4
// free, so it holds 8 raw chunks or 16 halves (a half chunk takes one 4 KiB page, a raw one two).
StoreOptions adaptcache_options(const TempDir& dir, double alpha) {
  StoreOptions o = with_codecs(options(&dir, 12, 64));
  o.adaptcache.enabled = true;
  o.adaptcache.alpha = alpha;
  o.adaptcache.bandwidth = {10e9, 1e6};  // the SSD is slow enough that a load there costs
  o.adaptcache.latency_seconds = {0, 0};
  o.adaptcache.prefill_seconds_per_token = 1;
  o.dram_reserve_fraction = 0.3;  // 4 chunks: room for the next save
  o.policy = EvictionPolicy::kLru;
  return o;
}

TEST(KvStoreCodecsTest, AdaptCacheCompressesInDramBeforeItDemotes) {
  TempDir dir;
  auto store = KvStore::open(adaptcache_options(dir, 0.05)).value();
  std::vector<std::vector<TokenId>> items;
  for (int i = 0; i < 6; ++i) {
    items.push_back(tokens(10 + i, 13));
    ASSERT_TRUE(save(*store, items.back()).ok());
    store->wait_idle();
  }
  const StoreStats s = store->stats();
  EXPECT_EQ(s.items, 6) << "nothing is evicted while the SSD has room";
  EXPECT_GT(s.transcodes, 0);
  EXPECT_LE(s.tier("dram").used_bytes, s.tier("dram").capacity_bytes);
  // With quality cheap, compressing beats leaving DRAM: at least 4 items stay near, encoded.
  int64_t in_dram = 0;
  for (const auto& t : items) in_dram += store->find(t, root(), {})->tier == kDramTier;
  EXPECT_GE(in_dram, 4);
  EXPECT_GT(s.codec_items[1] + s.codec_items[2], 3);
  for (const auto& t : items) EXPECT_GE(load_encoded(*store, t), 0);
}

TEST(KvStoreCodecsTest, AdaptCacheDemotesAnItemSavedInPiecesButKeepsItRaw) {
  TempDir dir;
  auto store = KvStore::open(adaptcache_options(dir, 0.05)).value();  // compressing pays
  // A turn of 17 chunks over a DRAM of 12: 9 published, then the rest once they left DRAM.
  const std::vector<TokenId> turn = tokens(30, 17 * kBlock + 1);
  const std::vector<kv::ChunkHash> hashes = chain(turn);
  SaveTicket ticket =
      store->begin_save({{}, true, 0, {hashes.begin(), hashes.begin() + 9}}).value();
  ASSERT_EQ(ticket.destinations.size(), 9u);
  for (int64_t i = 0; i < 9; ++i) fill(ticket.destinations[i], hashes[i]);
  SaveTicket next = store->continue_save(std::move(ticket), nullptr, 0);
  store->wait_idle();
  StoreStats s = store->stats();
  EXPECT_EQ(s.transcodes, 0) << "re-encoded between the save's pieces";
  EXPECT_EQ(s.tier("ssd").chunks, 9) << "AdaptCache demotes it raw below the DRAM reserve";
  ASSERT_EQ(store->extend_save(&next, std::span(hashes).subspan(9)), 8)
      << "its DRAM copy makes room for the rest";
  for (int64_t i = 0; i < 8; ++i) fill(next.destinations[i], hashes[9 + i]);
  store->commit_save(std::move(next), nullptr, 0);
  store->wait_idle();
  EXPECT_EQ(store->find(turn, root(), {})->num_chunks, 17);
  EXPECT_GE(load_encoded(*store, turn), 0);
}

TEST(KvStoreCodecsTest, AdaptCacheKeepsItemsWholeWhenQualityIsWorthMore) {
  TempDir dir;
  auto store = KvStore::open(adaptcache_options(dir, 1e6)).value();
  std::vector<std::vector<TokenId>> items;
  for (int i = 0; i < 6; ++i) {
    items.push_back(tokens(20 + i, 13));
    ASSERT_TRUE(save(*store, items.back()).ok());
    store->wait_idle();
  }
  const StoreStats s = store->stats();
  EXPECT_EQ(s.transcodes, 0);
  EXPECT_EQ(s.codec_items[0], 6);
  EXPECT_GT(s.tier("ssd").chunks, 0) << "what DRAM cannot hold whole went to the SSD";
  for (const auto& t : items) EXPECT_EQ(load_encoded(*store, t), 0);
}

TEST(KvStoreCodecsTest, AdaptCacheWeighsEachItemByItsTaskFamilysQuality) {
  TempDir dir;
  StoreOptions o = adaptcache_options(dir, 0.05);
  // Compressing ruins the answers of task 1 and barely changes those of task 2. Task 1's items
  // lose less by leaving DRAM raw (0.025 s of SSD reading, worth 0.5 of quality at alpha 0.05)
  // than by losing all their quality; task 2's lose 0.0005 by compressing.
  o.adaptcache.tasks = {"fragile", "robust"};
  o.codecs[0].task_quality = {0.0, 0.99};
  o.codecs[1].task_quality = {0.0, 0.9};
  EXPECT_EQ(o.adaptcache.task_index(""), 0);
  EXPECT_EQ(o.adaptcache.task_index("robust"), 2);
  EXPECT_EQ(o.adaptcache.task_index("code"), -1);
  auto store = KvStore::open(o).value();
  std::vector<std::vector<TokenId>> fragile, robust;
  for (int i = 0; i < 8; ++i) {
    std::vector<std::vector<TokenId>>& family = i % 2 == 0 ? fragile : robust;
    family.push_back(tokens(40 + i, 13));
    ASSERT_TRUE(save(*store, family.back(), {}, true, 0, i % 2 == 0 ? 1 : 2).ok());
    store->wait_idle();
  }
  const StoreStats s = store->stats();
  EXPECT_GT(s.transcodes, 0);
  // Counted per codec too (the metrics' and the bench's codec mix).
  EXPECT_EQ(s.codec_names, (std::vector<std::string>{"none", "half", "quarter"}));
  EXPECT_EQ(s.codec_transcodes[0], 0);
  EXPECT_EQ(s.codec_transcodes[1] + s.codec_transcodes[2], s.transcodes);
  for (const auto& t : fragile) {
    EXPECT_EQ(load_encoded(*store, t), 0) << "a fragile item was encoded";
  }
  int64_t encoded = 0;
  for (const auto& t : robust) encoded += load_encoded(*store, t) > 0;
  EXPECT_GE(encoded, 3);
}

TEST(KvStoreCodecsTest, AnItemsTaskFamilySurvivesARestart) {
  TempDir dir;
  SsdOptions o{.dir = dir.file("ssd"),
               .capacity_bytes = 1 << 20,
               .file_bytes = 1 << 20,
               .layout_tag = 7,
               .direct_io = false};
  const ItemRecord record{"session", true, 0, "kivi-4", 0, "long-document", {}};
  {
    std::vector<RecoveredItem> recovered;
    auto tier = SsdTier::open(o, &recovered).value();
    const int64_t sizes[] = {4096};
    Reservation r = tier->reserve(sizes).value();
    AlignedBuffer value(4096);
    const ChunkKey key{5, 0, kv::ChunkHash{1, 2}};
    const std::span<const std::byte> values[] = {{value.data(), 4096}};
    ASSERT_TRUE(tier->put(record, r, std::span(&key, 1), values).ok());
  }
  std::vector<RecoveredItem> recovered;
  auto tier = SsdTier::open(o, &recovered).value();
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0].attributes.task, "long-document");
  EXPECT_EQ(recovered[0].attributes.codec, "kivi-4");
  EXPECT_EQ(recovered[0].attributes.session, "session");
}

TEST(KvStoreCodecsTest, AdaptCacheChoosesOnlyAmongProfiledCodecs) {
  TempDir dir;
  StoreOptions o = adaptcache_options(dir, 0.05);
  o.codecs[0].quality = -1;  // "half" is not in the profile
  auto store = KvStore::open(o).value();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(save(*store, tokens(30 + i, 13)).ok());
    store->wait_idle();
  }
  const StoreStats s = store->stats();
  EXPECT_EQ(s.codec_items[1], 0);
  EXPECT_GT(s.codec_items[2], 0);
}

// codecs[1] keeps half of an item's chunks by token dropping: chunk 0 and the most recent ones.
StoreOptions with_streaming(StoreOptions o) {
  o.codecs = {{.name = "streaming-0.5",
               .chunk_bytes = kChunkBytes,
               .keep_fraction = 0.5,
               .task_quality = {}}};
  o.transcode = [](int32_t, int32_t, const std::vector<kv::krul::LayerPair>&,
                   std::span<const std::byte* const>, std::span<std::byte* const>) {
    return internal_error("token dropping re-encodes nothing");
  };
  o.fixed_codec = 1;
  return o;
}

// Loads the match's chunks and checks chunk i holds link i (i = 0) or i + skipped of `links`.
void expect_links(KvStore& store, const StoreMatch& m, const std::vector<kv::ChunkHash>& links) {
  StatusOr<StoreLease> lease = store.acquire(m.item, 0, m.num_chunks, m.skipped_chunks);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  for (int64_t i = 0; i < m.num_chunks; ++i) {
    EXPECT_TRUE(holds(lease->chunks[i], links[i == 0 ? 0 : i + m.skipped_chunks])) << "chunk " << i;
  }
  store.release(*lease, 0);
}

TEST(KvStoreCodecsTest, TokenDroppingKeepsTheSinksAndTheWindowFoundByContent) {
  auto store = KvStore::open(with_streaming(options(nullptr, 32))).value();
  const std::vector<TokenId> conv = tokens(1, 41);  // 10 full blocks of 4
  ASSERT_TRUE(save(*store, conv).ok());
  store->wait_idle();
  EXPECT_EQ(store->stats().transcodes, 1);
  EXPECT_EQ(store->stats().tier("dram").chunks, 5);  // ceil(10 / 2)
  std::optional<StoreMatch> m = store->find(conv, root(), {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 5);
  EXPECT_EQ(m->skipped_chunks, 5);
  EXPECT_EQ(m->token_offset, 5 * kBlock);
  EXPECT_FALSE(m->exact);
  expect_links(*store, *m, chain(conv));
  // A prompt ending at link 8 reaches links 0, 6 and 7 of the kept chunks.
  m = store->find(std::span<const TokenId>(conv).first(33), root(), {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 3);
  // One that differs in a dropped block shares only the first.
  std::vector<TokenId> other = conv;
  other[13] = 7;
  m = store->find(other, root(), {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 1);
}

TEST(KvStoreCodecsTest, AnItemSharingAPrefixStaysFoundWhenAnotherIsTokenDropped) {
  auto store = KvStore::open(with_streaming(options(nullptr, 32))).value();
  const std::vector<TokenId> conv = tokens(6, 41);
  const std::span<const TokenId> head = std::span<const TokenId>(conv).first(9);
  ASSERT_TRUE(save(*store, head).ok());  // 2 chunks: nothing to drop, it stays exact
  store->wait_idle();
  ASSERT_TRUE(save(*store, conv).ok());  // takes links 0 and 1 over, then drops them but 0
  store->wait_idle();
  std::optional<StoreMatch> m = store->find(head, root(), {});
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->exact) << "the exact item, not the token-dropped one's first chunk";
  EXPECT_EQ(m->num_chunks, 2);
  EXPECT_EQ(m->skipped_chunks, 0);
  m = store->find(conv, root(), {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->skipped_chunks, 5);
  // A match made before the codec dropped chunks no longer loads, except its chunk 0 (the
  // sinks), which token dropping keeps as it was: a prompt sharing only the first block with the
  // item loads it.
  const Status stale = store->acquire(m->item, 0, m->num_chunks, /*skipped_chunks=*/0).status();
  EXPECT_EQ(stale.code(), StatusCode::kNotFound);
  EXPECT_NE(stale.message().find("dropped chunks (token dropping) since it was matched"),
            std::string::npos)
      << stale.message();
  StatusOr<StoreLease> first = store->acquire(m->item, 0, 1, /*skipped_chunks=*/0);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_TRUE(holds(first->chunks[0], chain(conv)[0]));
  store->release(*first, 0);
}

TEST(KvStoreCodecsTest, TokenDroppedItemsSurviveARestartAndSessionsKeepTheirOffset) {
  TempDir dir;
  const StoreOptions o = with_streaming(options(&dir, 32, 64));
  const std::vector<TokenId> truncated = tokens(2, 41), exact = tokens(3, 41);
  {
    auto store = KvStore::open(o).value();
    // A session's truncated history (8 tokens left out after the first block): 8 chunks, 4 kept.
    ASSERT_TRUE(save(*store, truncated, "s", /*exact=*/false, /*offset=*/8).ok());
    ASSERT_TRUE(save(*store, exact).ok());
    store->wait_idle();
    EXPECT_EQ(store->stats().transcodes, 2);
  }  // a clean shutdown writes both to the SSD
  auto store = KvStore::open(o).value();
  std::optional<StoreMatch> m = store->find(truncated, root(), "s");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 4);
  EXPECT_EQ(m->skipped_chunks, 4);
  EXPECT_EQ(m->token_offset, 8 + 4 * kBlock);
  expect_links(*store, *m, chain(truncated, 8));
  EXPECT_FALSE(store->find(truncated, root(), {})) << "truncated history is found by session only";
  m = store->find(exact, root(), {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 5);
  expect_links(*store, *m, chain(exact));
}

TEST(KvStoreCodecsTest, ASaveContinuingTheLinksIsFoundByContentAndDropsFurther) {
  auto store = KvStore::open(with_streaming(options(nullptr, 64))).value();
  const std::vector<TokenId> conv = tokens(4, 41);
  ASSERT_TRUE(save(*store, conv).ok());
  store->wait_idle();
  // The next turn resumed it (20 tokens left out) and grew to 57 tokens: its blocks carry links
  // 0 and 6..13 of the whole conversation's chain.
  std::vector<TokenId> longer = conv;
  for (TokenId t : tokens(5, 16)) longer.push_back(t);
  const std::vector<kv::ChunkHash> links = chain(longer);
  SaveRequest request{"", false, 5 * kBlock, {links[0]}, 5};
  request.chain.insert(request.chain.end(), links.begin() + 6, links.end());
  SaveTicket ticket = store->begin_save(request).value();
  ASSERT_EQ(ticket.destinations.size(), 9u);
  for (size_t i = 0; i < 9; ++i) fill(ticket.destinations[i], request.chain[i]);
  store->commit_save(std::move(ticket), nullptr, 0);
  store->wait_idle();
  EXPECT_EQ(store->stats().items, 2);
  EXPECT_EQ(store->stats().transcodes, 2);
  longer.push_back(1);  // a token to compute after link 13
  std::optional<StoreMatch> m = store->find(longer, root(), {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 7);  // ceil(14 / 2)
  EXPECT_EQ(m->skipped_chunks, 7);
  EXPECT_EQ(m->token_offset, 7 * kBlock);
  expect_links(*store, *m, links);
}

// codecs[1] "merge" stands for the layer merge of 2 pairs: the first half of each chunk, made
// only with the item's 2 pairs at hand.
StoreOptions with_layer_merge(StoreOptions o, int32_t pairs = 2) {
  o.codecs = {{.name = "merge", .chunk_bytes = kHalf, .merged_pairs = pairs, .task_quality = {}}};
  o.transcode = [pairs](int32_t from, int32_t to, const std::vector<kv::krul::LayerPair>& p,
                        std::span<const std::byte* const> in, std::span<std::byte* const> out) {
    if (from != 0 || to != 1 || std::ssize(p) != pairs) return internal_error("not mergeable");
    for (size_t i = 0; i < in.size(); ++i) std::memcpy(out[i], in[i], kHalf);
    return Status();
  };
  o.fixed_codec = 1;
  return o;
}

TEST(KvStoreCodecsTest, ALayerMergeWaitsForTheConversationsPairsWhichTheJournalKeeps) {
  TempDir dir;
  StoreOptions o = with_layer_merge(options(&dir, 16, 64));
  const std::vector<TokenId> a = tokens(6, 9), b = tokens(7, 9);
  const std::vector<kv::krul::LayerPair> pairs = {{1, 2, 0.5}, {3, 5, 0.7}};
  {
    auto store = KvStore::open(o).value();
    ASSERT_TRUE(save(*store, a).ok());
    ASSERT_TRUE(save(*store, b).ok());
    store->wait_idle();
    EXPECT_EQ(store->stats().transcodes, 0);  // no pairs yet
    store->set_layer_pairs(store->find(a, root(), {})->item, pairs);
    store->set_layer_pairs(store->find(b, root(), {})->item, {{0, 1, 0.1}});  // one short
    store->wait_idle();
    EXPECT_EQ(store->stats().codec_items, (std::vector<int64_t>{1, 1}));
    StatusOr<StoreLease> lease = store->acquire(store->find(a, root(), {})->item, 0, 2);
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->codec, 1);
    ASSERT_EQ(lease->layer_pairs.size(), 2u);
    EXPECT_EQ(lease->layer_pairs[1].shallow, 3);
    EXPECT_EQ(lease->layer_pairs[1].deep, 5);
    store->release(*lease, 0);
    EXPECT_EQ(load_encoded(*store, b), 0);  // raw chunks carry no pairs
    // A merged item's pairs are fixed with its values.
    store->set_layer_pairs(store->find(a, root(), {})->item, {{0, 4, 0.1}, {1, 2, 0.1}});
  }
  {
    auto store = KvStore::open(o).value();  // the clean shutdown wrote both to the SSD tier
    EXPECT_EQ(store->stats().codec_items, (std::vector<int64_t>{1, 1}));
    StatusOr<StoreLease> lease = store->acquire(store->find(a, root(), {})->item, 0, 2);
    ASSERT_TRUE(lease.ok()) << lease.status().to_string();
    ASSERT_EQ(lease->layer_pairs.size(), 2u);
    EXPECT_EQ(lease->layer_pairs[0].shallow, 1);
    EXPECT_EQ(lease->layer_pairs[1].deep, 5);
    store->release(*lease, 0);
  }
  // Another layer_share (3 pairs) cannot decode them: the merged item is left out.
  auto store = KvStore::open(with_layer_merge(options(&dir, 16, 64), 3)).value();
  EXPECT_EQ(store->stats().codec_items, (std::vector<int64_t>{1, 0}));
  EXPECT_FALSE(store->find(a, root(), {}));
}

// AdaptCache may choose the layer merge (a profiled codec, quality 0.99) for a conversation with
// its layer pairs only: the others are demoted instead.
TEST(KvStoreCodecsTest, AdaptCacheMergesOnlyConversationsWithTheirLayerPairs) {
  TempDir dir;
  StoreOptions o = with_layer_merge(options(&dir, 12, 64));
  o.fixed_codec = 0;
  o.codecs[0].quality = 0.99;
  o.adaptcache.enabled = true;
  o.adaptcache.alpha = 0.05;  // quality is cheap: compressing beats leaving DRAM
  o.adaptcache.bandwidth = {10e9, 1e6};
  o.adaptcache.latency_seconds = {0, 0};
  o.adaptcache.prefill_seconds_per_token = 1;
  o.dram_reserve_fraction = 0.3;
  o.policy = EvictionPolicy::kLru;
  auto store = KvStore::open(o).value();
  std::vector<std::vector<TokenId>> items;
  for (int i = 0; i < 6; ++i) {
    items.push_back(tokens(40 + i, 13));
    ASSERT_TRUE(save(*store, items.back()).ok());
    if (i % 2 == 0)
      store->set_layer_pairs(store->find(items.back(), root(), {})->item,
                             {{0, 1, 0.0}, {2, 3, 0.0}});
    store->wait_idle();
  }
  int64_t merged = 0;
  for (int i = 0; i < 6; ++i) {
    const int32_t codec = load_encoded(*store, items[i]);
    if (i % 2 == 1) {
      EXPECT_EQ(codec, 0) << "item " << i << " has no layer pairs";
    }
    merged += codec == 1;
  }
  EXPECT_GT(merged, 0);
  EXPECT_EQ(store->stats().codec_items[1], merged);
}

// "h2o-0.5" with a stand-in for the executor's selection: kept chunk j is chunk n - 1 - j of the
// item, and *mass_seen the token mass it was given.
StoreOptions with_h2o(StoreOptions o, std::vector<float>* mass_seen) {
  o.codecs = {{.name = "h2o-0.5",
               .chunk_bytes = kChunkBytes,
               .keep_fraction = 0.5,
               .heavy_hitters = true,
               .task_quality = {}}};
  o.transcode = [](int32_t, int32_t, const std::vector<kv::krul::LayerPair>&,
                   std::span<const std::byte* const>, std::span<std::byte* const>) {
    return internal_error("H2O re-encodes nothing");
  };
  o.keep_heavy_hitters = [mass_seen](std::span<const float> mass,
                                     std::span<const std::byte* const> in,
                                     std::span<std::byte* const> out) {
    mass_seen->assign(mass.begin(), mass.end());
    for (size_t j = 0; j < out.size(); ++j) std::memcpy(out[j], in[in.size() - 1 - j], kChunkBytes);
    return Status();
  };
  o.fixed_codec = 1;
  return o;
}

TEST(KvStoreCodecsTest, H2oKeepsChunksChosenByTheTurnsAttentionLoadedOnlyAllTogether) {
  TempDir dir;
  std::vector<float> seen;
  const StoreOptions o = with_h2o(options(&dir, 32, 64), &seen);
  const std::vector<TokenId> conv = tokens(8, 41);  // 10 full blocks of 4
  const std::vector<kv::ChunkHash> links = chain(conv);
  ItemId item = 0;
  {
    auto store = KvStore::open(o).value();
    ASSERT_TRUE(save(*store, conv, "s").ok());
    store->wait_idle();
    EXPECT_EQ(store->stats().transcodes, 0) << "no token mass yet: the item stays raw";
    const std::optional<StoreMatch> before = store->find(conv, root(), "s");
    ASSERT_TRUE(before);
    item = before->item;
    store->set_token_mass(item, {1, 2, 3});
    store->wait_idle();
    EXPECT_EQ(store->stats().transcodes, 1);
    EXPECT_EQ(seen, (std::vector<float>{1, 2, 3}));
    // A match made before H2O chose the tokens loads nothing, not even its first chunk.
    EXPECT_EQ(store->acquire(item, 0, 1, /*skipped_chunks=*/0).status().code(),
              StatusCode::kNotFound);
  }  // a clean shutdown writes it to the SSD, whole chunks with it
  auto store = KvStore::open(o).value();
  for (const std::string session : {"s", ""}) {
    const std::optional<StoreMatch> m = store->find(conv, root(), session);
    ASSERT_TRUE(m) << "session '" << session << "'";
    EXPECT_EQ(m->item, item);
    EXPECT_EQ(m->num_chunks, 5);
    EXPECT_EQ(m->whole_chunks, 5);
    EXPECT_EQ(m->token_offset, 5 * kBlock);
    EXPECT_FALSE(m->exact);
    StatusOr<StoreLease> lease = store->acquire(m->item, 0, 5, m->skipped_chunks);
    ASSERT_TRUE(lease.ok()) << lease.status().to_string();
    for (int64_t j = 0; j < 5; ++j) EXPECT_TRUE(holds(lease->chunks[j], links[9 - j])) << j;
    store->release(*lease, 0);
  }
  // A prompt reaching only some of its links (streaming's would match 3 chunks) matches nothing.
  EXPECT_FALSE(store->find(std::span<const TokenId>(conv).first(33), root(), "s"));
  EXPECT_FALSE(store->find(std::span<const TokenId>(conv).first(33), root(), {}));
  // The next turn resumes it: its item's first 5 chunks are those, valid only together too.
  const std::vector<TokenId> next = tokens(8, 61);
  SaveRequest request{"s", false, 5 * kBlock, {}, 5, 0, /*whole_chunks=*/5};
  std::vector<kv::ChunkHash> full = chain(next);
  request.chain.push_back(full[0]);
  request.chain.insert(request.chain.end(), full.begin() + 6, full.end());  // links 6..14
  StatusOr<SaveTicket> ticket = store->begin_save(request);
  ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
  for (size_t i = 0; i < ticket->destinations.size(); ++i) {
    fill(ticket->destinations[i], request.chain[ticket->first_chunk + i]);
  }
  store->commit_save(*std::move(ticket), nullptr, 0);
  std::optional<StoreMatch> m = store->find(next, root(), "s");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 10);
  EXPECT_EQ(m->whole_chunks, 5);
  m = store->find(std::span<const TokenId>(next).first(45), root(), "s");  // links 0, 6..10
  ASSERT_TRUE(m);
  EXPECT_EQ(m->num_chunks, 6);
  EXPECT_FALSE(store->find(std::span<const TokenId>(next).first(33), root(), "s"))
      << "4 of its 5 whole chunks";
}

TEST(KvStoreCodecsTest, OptionsAreValidated) {
  StoreOptions o = with_codecs(options(nullptr, 16));
  o.transcode = nullptr;
  EXPECT_NE(KvStore::open(o).status().message().find("transcode"), std::string::npos);
  o = with_codecs(options(nullptr, 16));
  o.fixed_codec = 3;
  EXPECT_FALSE(KvStore::open(o).ok());
  o.fixed_codec = 1;
  o.adaptcache.enabled = true;
  EXPECT_FALSE(KvStore::open(o).ok());
  o.fixed_codec = 0;
  o.adaptcache.bandwidth = {1e9, 1e9};  // two tiers listed, one configured
  o.adaptcache.latency_seconds = {0, 0};
  EXPECT_NE(KvStore::open(o).status().message().find("one bandwidth"), std::string::npos);
  o = with_codecs(options(nullptr, 16));
  o.codecs[0].chunk_bytes = kChunkBytes + 1;
  EXPECT_FALSE(KvStore::open(o).ok());
  // Task qualities: one per task family, each in [0, 1].
  o = with_codecs(options(nullptr, 16));
  o.adaptcache.tasks = {"chat", "code"};
  o.codecs[0].task_quality = {0.9};
  EXPECT_NE(KvStore::open(o).status().message().find("1 task qualities for 2 task families"),
            std::string::npos);
  o.codecs[0].task_quality = {0.9, 1.5};
  EXPECT_NE(KvStore::open(o).status().message().find("outside [0, 1]"), std::string::npos);
  o.codecs[0].task_quality = {0.9, 0.5};
  EXPECT_TRUE(KvStore::open(o).ok());
}

}  // namespace
}  // namespace strata::store
