// Pages of fixed bytes holding blocks of several formats (PageLayout, BlockPool), and sequences
// whose layers take different formats or share another layer's blocks (KvCacheManager).
#include <gtest/gtest.h>

#include <numeric>

#include "strata/kv/block_pool.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/kv/page_layout.h"

namespace strata::kv {
namespace {

// One KV head of head_dim 8, blocks of 4 tokens: a bf16 block is 2 * 4 * 8 * 2 = 128 bytes.
constexpr int64_t kHeads = 1, kBlock = 4, kDim = 8;
const KvFormat kBf16 = KvFormat::plain(DType::kBFloat16);
// int4 with one group per token: data 16 + scales 8 + zeros 8 per tensor = 64 bytes a block.
const KvFormat kInt4{{DType::kInt4, Grouping::kPerToken, 8},
                     {DType::kInt4, Grouping::kPerToken, 8}};
// K int8 (32 + 16 + 8 + 8 = 48... data 32, scales at 32, 8 + 8: 48) and V int4 (32): 80 bytes.
const KvFormat kK8V4{{DType::kInt8, Grouping::kPerToken, 8},
                     {DType::kInt4, Grouping::kPerToken, 8}};

PageLayout layout(int32_t page_blocks) {
  StatusOr<PageLayout> l =
      PageLayout::create(kBf16, {kInt4, kK8V4}, page_blocks, kHeads, kBlock, kDim);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return std::move(l).value();
}

ChunkHash hash_of(uint64_t v) { return {v, ~v}; }

TEST(PageLayoutTest, PagesHoldAsManyBlocksAsTheirBytesAllow) {
  const PageLayout l = layout(2);
  EXPECT_EQ(l.page_bytes(), 256);
  EXPECT_EQ(l.block_bytes(kBf16), 128);
  EXPECT_EQ(l.block_bytes(kInt4), 64);
  EXPECT_EQ(l.block_bytes(kK8V4), 80);
  EXPECT_EQ(l.blocks_per_page(kBf16), 2);
  EXPECT_EQ(l.blocks_per_page(kInt4), 4);
  EXPECT_EQ(l.blocks_per_page(kK8V4), 3);
  EXPECT_EQ(l.max_blocks_per_page(), 4);
  const BlockId b = l.block(5, 1);
  EXPECT_EQ(l.page_of(b), 5);
  EXPECT_EQ(l.slot_of(b), 1);
  EXPECT_EQ(l.byte_offset(b, kK8V4), 5 * 256 + 80);
  EXPECT_EQ(l.base_index(b), 11) << "the pool viewed as bf16 blocks: page 5, second block";
  EXPECT_FALSE(l.holds(KvFormat::plain(DType::kFloat16)));
}

TEST(PageLayoutTest, RefusesFormatsThatDoNotFitOrDoNotValidate) {
  StatusOr<PageLayout> big =
      PageLayout::create(kBf16, {KvFormat::plain(DType::kFloat32)}, 1, kHeads, kBlock, kDim);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("does not fit a page"), std::string::npos);
  const KvFormat odd{{DType::kInt4, Grouping::kPerToken, 3},
                     {DType::kInt4, Grouping::kPerToken, 8}};
  EXPECT_FALSE(PageLayout::create(kBf16, {odd}, 1, kHeads, kBlock, kDim).ok());
  EXPECT_FALSE(PageLayout::create(kBf16, {}, 0, kHeads, kBlock, kDim).ok());
}

TEST(KvFormatNameTest, NamesParseBackToTheirFormats) {
  for (const KvFormat& f : {kBf16, kInt4, kK8V4, KvFormat::plain(DType::kFloat8E4M3),
                            KvFormat{{DType::kInt2, Grouping::kPerChannel, 0},
                                     {DType::kFloat16, Grouping::kNone, 0}}}) {
    StatusOr<KvFormat> parsed = parse_format(format_name(f));
    ASSERT_TRUE(parsed.ok()) << format_name(f) << ": " << parsed.status().to_string();
    EXPECT_EQ(*parsed, f) << format_name(f);
  }
  EXPECT_EQ(*parse_format("bf16"), kBf16) << "dtype spellings";
  for (const char* bad : {"", "int3", "int4/token", "int4/tokens8", "int4/row", "k:int8/token64",
                          "k:int8/token64,v:", "int8/token123456"}) {
    EXPECT_FALSE(parse_format(bad).ok()) << bad;
  }
}

TEST(BlockPoolPagesTest, SmallFormatsShareAPageAndCapacityIsInBytes) {
  BlockPool pool(layout(2), 4);
  EXPECT_EQ(pool.capacity_bytes(), 4 * 256);
  EXPECT_EQ(pool.num_blocks(), 8) << "in bf16 blocks";
  std::vector<BlockId> small = pool.allocate(5, kInt4);  // one full page and one block of another
  EXPECT_EQ(pool.used_bytes(), 5 * 64);
  EXPECT_EQ(pool.num_available_pages(), 2);
  EXPECT_EQ(pool.layout().page_of(small[0]), pool.layout().page_of(small[3]));
  EXPECT_NE(pool.layout().page_of(small[0]), pool.layout().page_of(small[4]));
  EXPECT_EQ(pool.pages_for(3, kInt4), 0) << "the open page has room for three";
  EXPECT_EQ(pool.pages_for(4, kInt4), 1);
  EXPECT_EQ(pool.pages_for(1, kBf16), 1) << "formats never mix in a page";
  std::vector<BlockId> wide = pool.allocate(4, kBf16);
  EXPECT_EQ(pool.num_available_pages(), 0);
  EXPECT_EQ(pool.format(wide[0]), kBf16);
  EXPECT_EQ(pool.format(small[4]), kInt4);
  std::vector<BlockId> more = pool.allocate(3, kInt4);  // fills the open page
  EXPECT_EQ(pool.layout().page_of(more[2]), pool.layout().page_of(small[4]));
  for (BlockId b : small) pool.release(b);
  EXPECT_EQ(pool.num_available_pages(), 1) << "a page is free only when all its blocks are";
  for (BlockId b : more) pool.release(b);
  for (BlockId b : wide) pool.release(b);
  EXPECT_EQ(pool.num_available_pages(), 4);
  EXPECT_EQ(pool.used_bytes(), 0);
}

TEST(BlockPoolPagesTest, EvictionFreesOnlyPagesWithNothingPinned) {
  BlockPool pool(layout(2), 2);
  std::vector<BlockId> cached = pool.allocate(2, kInt4);
  std::vector<BlockId> live = pool.allocate(1, kInt4);  // same page
  ASSERT_TRUE(pool.insert_cached(hash_of(1), cached));
  for (BlockId b : cached) pool.release(b);
  pool.release_cached(hash_of(1));
  EXPECT_EQ(pool.num_available_pages(), 1) << "the live block pins the group's page";
  EXPECT_EQ(pool.pages_for(1, kInt4), 0) << "the pinned page still has a free slot";
  pool.release(live[0]);
  EXPECT_EQ(pool.num_available_pages(), 2) << "now only evictable blocks hold it";
  EXPECT_EQ(pool.pages_pinned_by(std::vector<ChunkHash>{hash_of(1)}), 1);
  std::vector<BlockId> wide = pool.allocate(4, kBf16);  // needs both pages: evicts the group
  EXPECT_EQ(pool.find_cached(hash_of(1)), nullptr);
  EXPECT_EQ(pool.num_evicted_groups(), 1);
  for (BlockId b : wide) pool.release(b);
  EXPECT_EQ(pool.num_available_pages(), 2);
}

TEST(BlockPoolPagesTest, AGroupNamingABlockTwiceHoldsItOnce) {
  BlockPool pool(layout(1), 4);
  std::vector<BlockId> b = pool.allocate(1, kBf16);
  const std::vector<BlockId> group = {b[0], b[0]};  // two layers, one block
  ASSERT_TRUE(pool.insert_cached(hash_of(7), group));
  EXPECT_EQ(pool.refcount(b[0]), 2) << "the table entry and the cache";
  pool.release(b[0]);
  pool.release_cached(hash_of(7));
  EXPECT_EQ(pool.num_available_pages(), 4);
  pool.allocate(4, kBf16);
  EXPECT_EQ(pool.find_cached(hash_of(7)), nullptr);
}

// --- sequences -----------------------------------------------------------------------------

constexpr int32_t kLayers = 4;

KvGeometry geometry(int32_t num_blocks, int32_t page_blocks) {
  return {.num_layers = kLayers,
          .num_kv_heads = kHeads,
          .head_dim = kDim,
          .block_size_tokens = kBlock,
          .num_blocks = num_blocks,
          .page_blocks = page_blocks,
          .formats = {kInt4, kK8V4}};
}

std::vector<TokenId> tokens(int n) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), 1);
  return t;
}

StepCopies step(KvCacheManager& m, SeqId seq, int64_t n) {
  StatusOr<KvPlan> plan = m.prepare({{seq, n}});
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  StepCopies copies;
  m.commit(std::move(plan).value(), &copies);
  m.mark_computed(seq, n);
  return copies;
}

TEST(KvLayoutTest, LayersOfSeveralFormatsInOnePool) {
  KvCacheManager m(geometry(32, 2), kBf16, {});
  KvLayout mixed{{kBf16, kInt4, kK8V4, kInt4}, {}};
  ASSERT_TRUE(m.add_sequence(SeqId{1}, tokens(16), "", true, mixed).ok());
  ASSERT_TRUE(m.add_sequence(SeqId{2}, tokens(16), "").ok());
  StatusOr<KvPlan> plan = m.prepare({{SeqId{1}, 16}});
  ASSERT_TRUE(plan.ok());
  // 4 token blocks: bf16 layer 2 pages, the two int4 layers 8 blocks = 2 pages, K8V4 4 blocks = 2.
  EXPECT_EQ(plan->num_blocks_needed(), 6 * 2);
  step(m, SeqId{1}, 16);
  const auto& t = m.tables(SeqId{1});
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(m.page_layout().page_of(t[1][0]), m.page_layout().page_of(t[1][i]))
        << "four int4 blocks fill one page";
  }
  EXPECT_EQ(m.page_layout().slot_of(t[2][2]), 2) << "three K8V4 blocks to a page";
  EXPECT_EQ(m.used_bytes(), 4 * (128 + 64 + 80 + 64));
  step(m, SeqId{2}, 16);  // bf16 throughout: 16 blocks = 8 pages
  EXPECT_EQ(m.num_available_blocks(), 32 - 2 * 14);
}

TEST(KvLayoutTest, APlanThatDoesNotFitInPagesIsRefused) {
  KvCacheManager m(geometry(4, 2), kBf16, {});  // 2 pages
  ASSERT_TRUE(m.add_sequence(SeqId{1}, tokens(8), "").ok());
  EXPECT_FALSE(m.prepare({{SeqId{1}, 8}}).ok()) << "8 bf16 blocks need 4 pages";
  ASSERT_TRUE(
      m.add_sequence(SeqId{2}, tokens(8), "", true, {{kInt4, kInt4, kInt4, kInt4}, {}}).ok());
  EXPECT_TRUE(m.prepare({{SeqId{2}, 8}}).ok()) << "8 int4 blocks fit 2 pages";
}

TEST(KvLayoutTest, SharingLayersAliasTheirOwnersBlocks) {
  KvGeometry g = geometry(64, 1);
  g.num_host_blocks = 64;
  KvCacheManager m(g, kBf16, {});
  const KvLayout shared{{}, {-1, 0, -1, 2}};
  ASSERT_TRUE(m.add_sequence(SeqId{1}, tokens(10), "", true, shared).ok());
  StatusOr<KvPlan> plan = m.prepare({{SeqId{1}, 10}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks_needed(), 3 * 2) << "two owner layers, three token blocks";
  step(m, SeqId{1}, 10);
  const auto tables = m.tables(SeqId{1});
  EXPECT_EQ(tables[1], tables[0]);
  EXPECT_EQ(tables[3], tables[2]);
  EXPECT_NE(tables[0][0], tables[2][0]);
  EXPECT_EQ(m.refcount(tables[0][2]), 2) << "one reference per table entry";

  // A fork writes into its shared partial block: one copy per owner, the sharer follows.
  ASSERT_TRUE(m.fork(SeqId{1}, SeqId{2}).ok());
  m.append_tokens(SeqId{2}, std::vector<TokenId>{99});
  StepCopies cow = step(m, SeqId{2}, 1);
  ASSERT_EQ(cow.device.size(), 2u);
  const auto child = m.tables(SeqId{2});
  EXPECT_EQ(child[1], child[0]);
  EXPECT_NE(child[0][2], tables[0][2]);
  EXPECT_EQ(child[0][0], tables[0][0]) << "full blocks stay shared";
  m.free(SeqId{2});

  // Swapping moves each owner block once; the sharers follow there and back.
  ASSERT_TRUE(m.can_swap_out(SeqId{1}));
  StepCopies out;
  m.swap_out(SeqId{1}, &out);
  EXPECT_EQ(out.swap_out.size(), 6u);
  EXPECT_EQ(m.tables(SeqId{1})[1], m.tables(SeqId{1})[0]);
  m.append_tokens(SeqId{1}, std::vector<TokenId>{5});
  StepCopies in = step(m, SeqId{1}, 1);
  EXPECT_EQ(in.swap_in.size(), 6u);
  EXPECT_EQ(m.tables(SeqId{1})[3], m.tables(SeqId{1})[2]);
  m.free(SeqId{1});
  EXPECT_EQ(m.num_available_blocks(), 64) << "nothing leaks";
  EXPECT_EQ(m.num_free_host_blocks(), 64);
}

TEST(KvLayoutTest, PrefixesAreSharedWithinALayoutOnly) {
  KvCacheManager m(geometry(64, 2), kBf16, {.enabled = true});
  const KvLayout int4{{kInt4, kInt4, kInt4, kInt4}, {}};
  ASSERT_TRUE(m.add_sequence(SeqId{1}, tokens(9), "", true, int4).ok());
  step(m, SeqId{1}, 9);
  ASSERT_TRUE(m.add_sequence(SeqId{2}, tokens(9), "").ok());
  EXPECT_EQ(m.lookup_prefix(SeqId{2}), 0) << "bf16 pages cannot use int4 ones";
  ASSERT_TRUE(m.add_sequence(SeqId{3}, tokens(9), "", true, int4).ok());
  EXPECT_EQ(m.lookup_prefix(SeqId{3}), 8);
}

TEST(KvLayoutTest, BadLayoutsAreRefusedNamingTheLayer) {
  KvCacheManager m(geometry(64, 2), kBf16, {});
  const KvFormat fp16 = KvFormat::plain(DType::kFloat16);
  Status s = m.add_sequence(SeqId{1}, tokens(4), "", true, {{kBf16, fp16, kBf16, kBf16}, {}});
  EXPECT_NE(s.message().find("layer 1"), std::string::npos) << s.to_string();
  s = m.add_sequence(SeqId{1}, tokens(4), "", true, {{kBf16, kBf16}, {}});
  EXPECT_FALSE(s.ok());
  s = m.add_sequence(SeqId{1}, tokens(4), "", true, {{}, {-1, 2, -1, -1}});
  EXPECT_NE(s.message().find("layer 1"), std::string::npos) << "only an earlier layer";
  s = m.add_sequence(SeqId{1}, tokens(4), "", true, {{}, {-1, 0, 1, -1}});
  EXPECT_NE(s.message().find("layer 2"), std::string::npos) << "not a layer that shares";
  s = m.add_sequence(SeqId{1}, tokens(4), "", true,
                     {{kBf16, kInt4, kBf16, kBf16}, {-1, 0, -1, -1}});
  EXPECT_NE(s.message().find("same format"), std::string::npos);
  EXPECT_FALSE(m.has_sequence(SeqId{1}));
}

// Per-KV-head tables: two KV heads, each layer split into two tables of one-head blocks.
TEST(KvLayoutTest, PerHeadTablesHoldBlocksOfTheirHeadsOnly) {
  KvGeometry g{.num_layers = 2,
               .num_kv_heads = 2,
               .head_dim = kDim,
               .block_size_tokens = kBlock,
               .num_blocks = 32,
               .page_blocks = 2,
               .formats = {kInt4},
               .head_groups = {2}};
  KvCacheManager m(g, kBf16, {});
  const PageLayout& l = m.page_layout();
  EXPECT_EQ(l.block_bytes(kBf16, 1) * 2, l.block_bytes(kBf16));
  EXPECT_EQ(l.blocks_per_page(kBf16, 1), 2 * l.blocks_per_page(kBf16));
  // Layer 0: head 0 bf16, head 1 int4; layer 1 shares layer 0.
  const KvLayout per_head{{kBf16, kInt4, kBf16, kInt4}, {-1, 0}, 2};
  ASSERT_TRUE(m.add_sequence(SeqId{1}, tokens(9), "", true, per_head).ok());
  step(m, SeqId{1}, 9);
  const auto& t = m.tables(SeqId{1});
  ASSERT_EQ(t.size(), 4u) << "two tables a layer";
  EXPECT_EQ(t[2], t[0]);
  EXPECT_EQ(t[3], t[1]);
  EXPECT_NE(t[0][0], t[1][0]);
  EXPECT_EQ(m.used_bytes(), 3 * (l.block_bytes(kBf16, 1) + l.block_bytes(kInt4, 1)));
  // A fork's copy-on-write and a swap move one-head blocks in their own format.
  ASSERT_TRUE(m.fork(SeqId{1}, SeqId{2}).ok());
  m.append_tokens(SeqId{2}, std::vector<TokenId>{7});
  const StepCopies cow = step(m, SeqId{2}, 1);
  ASSERT_EQ(cow.device.size(), 2u);
  EXPECT_EQ(cow.device[0].heads, 1);
  EXPECT_EQ(cow.device[1].format, kInt4);
  m.free(SeqId{1});
  m.free(SeqId{2});
  EXPECT_EQ(m.num_available_blocks(), 32);
}

TEST(KvLayoutTest, HeadGroupsMustBeASplitThePoolWasBuiltFor) {
  KvGeometry g{.num_layers = 2,
               .num_kv_heads = 2,
               .head_dim = kDim,
               .block_size_tokens = kBlock,
               .num_blocks = 32,
               .page_blocks = 2,
               .formats = {},
               .head_groups = {2}};
  KvCacheManager m(g, kBf16, {});
  EXPECT_FALSE(m.add_sequence(SeqId{1}, tokens(4), "", true, {{}, {}, 4}).ok());
  EXPECT_FALSE(m.add_sequence(SeqId{1}, tokens(4), "", true, {{kBf16, kBf16}, {}, 2}).ok())
      << "one format per table: four";
  KvCacheManager whole({.num_layers = 2,
                        .num_kv_heads = 2,
                        .head_dim = kDim,
                        .block_size_tokens = kBlock,
                        .num_blocks = 32},
                       kBf16, {});
  const Status s = whole.add_sequence(SeqId{1}, tokens(4), "", true, {{}, {}, 2});
  EXPECT_NE(s.message().find("head groups"), std::string::npos) << s.to_string();
  EXPECT_TRUE(PageLayout::create(kBf16, {}, 1, 2, kBlock, kDim, {3})
                  .status()
                  .message()
                  .find("does not divide") != std::string::npos);
}

}  // namespace
}  // namespace strata::kv
