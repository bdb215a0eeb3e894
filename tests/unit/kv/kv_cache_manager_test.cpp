#include "strata/kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>

namespace strata::kv {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kBlock = 4;

KvGeometry geometry(int32_t num_blocks) {
  return {.num_layers = kLayers, .num_kv_heads = 1, .head_dim = 8, .block_size_tokens = kBlock,
          .num_blocks = num_blocks};
}

std::vector<TokenId> iota_tokens(int n, TokenId first = 1) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Runs one step for `seq`: prepare + commit + mark_computed of n tokens.
void step(KvCacheManager& m, SeqId seq, int64_t n) {
  StatusOr<KvPlan> plan = m.prepare({{seq, n}});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  StepCopies copies;
  m.commit(std::move(plan).value(), &copies);
  m.mark_computed(seq, n);
}

TEST(KvCacheManagerTest, AllocatesPerLayerBlocksAndPublishesFullBlocks) {
  KvCacheManager m(geometry(32), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(10), "").ok());
  StatusOr<KvPlan> plan = m.prepare({{SeqId{1}, 10}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks_needed(), 3 * kLayers);
  EXPECT_EQ(m.num_available_blocks(), 32) << "prepare changes nothing";
  StepCopies copies;
  m.commit(std::move(plan).value(), &copies);
  EXPECT_TRUE(copies.device.empty() && copies.swap_in.empty());
  m.mark_computed(SeqId{1}, 10);
  const auto& tables = m.tables(SeqId{1});
  ASSERT_EQ(tables.size(), 2u);
  EXPECT_EQ(tables[0].size(), 3u);
  EXPECT_NE(tables[0][0], tables[1][0]) << "each layer has its own blocks";
  EXPECT_EQ(m.num_cached_groups(), 2) << "two full blocks published, the partial one not";
  EXPECT_EQ(m.num_available_blocks(), 32 - 6);
  m.free(SeqId{1});
  EXPECT_EQ(m.num_available_blocks(), 32) << "cached blocks are evictable, nothing leaks";
  EXPECT_EQ(m.num_cached_groups(), 2);
}

TEST(KvCacheManagerTest, PrefixHitSharesBlocksAndCounts) {
  KvCacheManager m(geometry(64), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(10), "").ok());
  step(m, SeqId{1}, 10);

  std::vector<TokenId> prompt = iota_tokens(9);  // shares 2 full blocks, then differs
  prompt.push_back(99);
  prompt.push_back(98);
  ASSERT_TRUE(m.add_sequence(SeqId{2}, prompt, "").ok());
  EXPECT_EQ(m.lookup_prefix(SeqId{2}), 8);
  StatusOr<KvPlan> plan = m.prepare({{SeqId{2}, 3}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks_needed(), 1 * kLayers) << "blocks in use are not counted again";
  StepCopies copies;
  m.commit(std::move(plan).value(), &copies);
  EXPECT_EQ(m.num_prefix_hit_tokens(SeqId{2}), 8);
  EXPECT_EQ(m.num_computed_tokens(SeqId{2}), 8);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(m.tables(SeqId{2})[l][0], m.tables(SeqId{1})[l][0]);
    EXPECT_EQ(m.tables(SeqId{2})[l][1], m.tables(SeqId{1})[l][1]);
    EXPECT_NE(m.tables(SeqId{2})[l][2], m.tables(SeqId{1})[l][2]);
    EXPECT_EQ(m.refcount(m.tables(SeqId{1})[l][0]), 3) << "two tables and the cache";
  }
  EXPECT_EQ(m.prefix_stats().hit_tokens, 8);
  EXPECT_EQ(m.prefix_stats().lookup_tokens, 10 + 11);
  m.mark_computed(SeqId{2}, 3);
  m.free(SeqId{1});
  m.free(SeqId{2});
  EXPECT_EQ(m.num_available_blocks(), 64);
}

// Table-driven prefix matching: how many tokens a second prompt gets from the cache.
TEST(KvCacheManagerTest, PrefixMatchTable) {
  struct Case {
    const char* name;
    std::vector<TokenId> second;
    std::string salt;
    int64_t expected_hit;
  };
  const std::vector<Case> cases = {
      {"identical 12 tokens: last block recomputed", iota_tokens(12), "", 8},
      {"identical 9 tokens", iota_tokens(9), "", 8},
      {"identical 8 tokens: leave one to compute", iota_tokens(8), "", 4},
      {"first token differs", iota_tokens(12, 2), "", 0},
      {"differs inside block 2", [] { auto t = iota_tokens(12); t[5] = 0; return t; }(), "", 4},
      {"other tenant", iota_tokens(12), "tenant-b", 0},
      {"shorter than a block", iota_tokens(3), "", 0},
  };
  for (const Case& c : cases) {
    KvCacheManager m(geometry(64), {}, {});
    ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(12), "").ok());
    step(m, SeqId{1}, 12);
    ASSERT_TRUE(m.add_sequence(SeqId{2}, c.second, c.salt).ok());
    EXPECT_EQ(m.lookup_prefix(SeqId{2}), c.expected_hit) << c.name;
  }
}

TEST(KvCacheManagerTest, ExhaustedPoolRejectsPlanAndChangesNothing) {
  KvCacheManager m(geometry(6), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(8), "").ok());
  ASSERT_TRUE(m.add_sequence(SeqId{2}, iota_tokens(8, 100), "").ok());
  step(m, SeqId{1}, 8);  // 4 blocks
  StatusOr<KvPlan> plan = m.prepare({{SeqId{2}, 8}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(m.tables(SeqId{2}).empty());
  EXPECT_EQ(m.num_available_blocks(), 2);

  // A prepared plan that is dropped leaves everything as it was.
  { StatusOr<KvPlan> dropped = m.prepare({{SeqId{2}, 4}}); ASSERT_TRUE(dropped.ok()); }
  EXPECT_EQ(m.num_available_blocks(), 2);
  EXPECT_TRUE(m.tables(SeqId{2}).empty());

  // Once sequence 1 finishes, its cached blocks are evicted on demand.
  m.free(SeqId{1});
  step(m, SeqId{2}, 8);
  // 2 blocks were free; the least recently used of sequence 1's groups made room for the rest.
  EXPECT_EQ(m.num_cached_groups(), 3);
  EXPECT_EQ(m.lookup_prefix(SeqId{2}), 0) << "sequence 2 has blocks";
}

TEST(KvCacheManagerTest, ForkSharesBlocksAndCopiesOnWrite) {
  KvCacheManager m(geometry(32), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(6), "").ok());
  step(m, SeqId{1}, 6);  // one full block + a partial one
  ASSERT_TRUE(m.fork(SeqId{1}, SeqId{2}).ok());
  EXPECT_EQ(m.tables(SeqId{2}), m.tables(SeqId{1}));
  const BlockId shared_partial = m.tables(SeqId{1})[0][1];
  EXPECT_EQ(m.refcount(shared_partial), 2);

  m.append_tokens(SeqId{1}, std::vector<TokenId>{50});
  m.append_tokens(SeqId{2}, std::vector<TokenId>{60});
  StatusOr<KvPlan> plan = m.prepare({{SeqId{1}, 1}, {SeqId{2}, 1}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks_needed(), 2 * kLayers) << "both see a shared partial block";
  StepCopies copies;
  m.commit(std::move(plan).value(), &copies);
  ASSERT_EQ(copies.device.size(), static_cast<size_t>(kLayers)) << "only the first writer copies";
  EXPECT_EQ(copies.device[0].source, shared_partial);
  EXPECT_NE(m.tables(SeqId{1})[0][1], m.tables(SeqId{2})[0][1]);
  EXPECT_EQ(m.tables(SeqId{1})[0][0], m.tables(SeqId{2})[0][0]) << "full blocks stay shared";
  m.free(SeqId{1});
  m.free(SeqId{2});
  EXPECT_EQ(m.num_available_blocks(), 32);
}

TEST(KvCacheManagerTest, SwapOutToTheHostPoolAndBackIn) {
  KvGeometry g = geometry(8);
  g.num_host_blocks = 8;
  KvCacheManager m(g, {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(6), "").ok());
  step(m, SeqId{1}, 6);  // 2 token blocks x 2 layers
  const std::vector<std::vector<BlockId>> device_tables = m.tables(SeqId{1});
  ASSERT_TRUE(m.can_swap_out(SeqId{1}));
  StepCopies out;
  m.swap_out(SeqId{1}, &out);
  ASSERT_EQ(out.swap_out.size(), 4u);
  EXPECT_EQ(out.swap_out[0].source, device_tables[0][0]);
  EXPECT_TRUE(m.is_swapped(SeqId{1}));
  EXPECT_EQ(m.num_free_host_blocks(), 4);
  EXPECT_EQ(m.num_available_blocks(), 8) << "device blocks freed (the full one stays cached)";
  EXPECT_EQ(m.num_computed_tokens(SeqId{1}), 6);
  EXPECT_FALSE(m.can_swap_out(SeqId{1}));

  m.append_tokens(SeqId{1}, std::vector<TokenId>{42});
  StatusOr<KvPlan> plan = m.prepare({{SeqId{1}, 1}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks_needed(), 4) << "all blocks come back; the 7th token fits";
  StepCopies in;
  m.commit(std::move(plan).value(), &in);
  ASSERT_EQ(in.swap_in.size(), 4u);
  EXPECT_EQ(in.swap_in[0].source, out.swap_out[0].destination);
  EXPECT_FALSE(m.is_swapped(SeqId{1}));
  EXPECT_EQ(m.num_free_host_blocks(), 8);
  m.mark_computed(SeqId{1}, 1);
  m.free(SeqId{1});
  EXPECT_EQ(m.num_available_blocks(), 8);
}

TEST(KvCacheManagerTest, ExternalPrefixIsLoadedBeyondThePrefixCache) {
  KvCacheManager m(geometry(64), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(9), "").ok());
  step(m, SeqId{1}, 9);  // publishes blocks 0-1
  m.free(SeqId{1});

  // 4 blocks are in the store; the prefix cache covers 2 of them: 2 are loaded.
  ASSERT_TRUE(m.add_sequence(SeqId{2}, iota_tokens(18), "").ok());
  m.set_external_prefix(SeqId{2}, 4, /*exact=*/true);
  EXPECT_EQ(m.lookup_prefix(SeqId{2}), 16);
  StatusOr<KvPlan> plan = m.prepare({{SeqId{2}, 2}});
  ASSERT_TRUE(plan.ok());
  // 2 loaded + 1 computed blocks per layer, plus the 2 evictable cached groups it takes.
  EXPECT_EQ(plan->num_blocks_needed(), (3 + 2) * kLayers);
  StepCopies copies;
  m.commit(std::move(plan).value(), &copies);
  ASSERT_EQ(copies.loads.size(), 1u);
  EXPECT_EQ(copies.loads[0].seq, SeqId{2});
  EXPECT_EQ(copies.loads[0].first_block, 2);
  EXPECT_EQ(copies.loads[0].num_blocks, 2);
  EXPECT_EQ(m.num_computed_tokens(SeqId{2}), 16);
  EXPECT_EQ(m.num_prefix_hit_tokens(SeqId{2}), 8);
  EXPECT_EQ(m.num_loaded_tokens(SeqId{2}), 8);
  m.mark_computed(SeqId{2}, 2);
  EXPECT_EQ(m.num_cached_groups(), 4) << "exact loaded blocks are published";
  m.free(SeqId{2});
  EXPECT_EQ(m.num_available_blocks(), 64);
}

TEST(KvCacheManagerTest, InexactExternalPrefixBypassesThePrefixCache) {
  KvCacheManager m(geometry(64), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(9), "").ok());
  step(m, SeqId{1}, 9);
  m.free(SeqId{1});
  ASSERT_TRUE(m.add_sequence(SeqId{2}, iota_tokens(13), "").ok());
  m.set_external_prefix(SeqId{2}, 3, /*exact=*/false);
  StepCopies copies;
  m.commit(m.prepare({{SeqId{2}, 1}}).value(), &copies);
  ASSERT_EQ(copies.loads.size(), 1u);
  EXPECT_EQ(copies.loads[0].first_block, 0) << "the cached blocks 0-1 are not used";
  EXPECT_EQ(copies.loads[0].num_blocks, 3);
  m.mark_computed(SeqId{2}, 1);
  EXPECT_EQ(m.num_cached_groups(), 2) << "nothing inexact is published";
  m.free(SeqId{2});
  EXPECT_EQ(m.num_available_blocks(), 64);
}

TEST(KvCacheManagerTest, OffPoolSequenceFreesItsBlocksAndNeedsNoMore) {
  KvCacheManager m(geometry(8), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(10), "").ok());
  step(m, SeqId{1}, 10);  // 3 token blocks x 2 layers; 2 full ones published
  EXPECT_EQ(m.num_available_blocks(), 2);
  m.move_off_pool(SeqId{1});
  EXPECT_TRUE(m.is_off_pool(SeqId{1}));
  EXPECT_TRUE(m.tables(SeqId{1}).empty());
  EXPECT_EQ(m.num_available_blocks(), 8) << "its cached blocks stay cached, evictable";
  EXPECT_EQ(m.lookup_prefix(SeqId{1}), 0);
  m.append_tokens(SeqId{1}, iota_tokens(30, 100));
  // Decode steps far past what the pool could hold: no blocks, only the count moves.
  for (int i = 0; i < 30; ++i) {
    StatusOr<KvPlan> plan = m.prepare({{SeqId{1}, 1}});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->num_blocks_needed(), 0);
    StepCopies copies;
    m.commit(std::move(plan).value(), &copies);
    m.mark_computed(SeqId{1}, 1);
  }
  EXPECT_EQ(m.num_computed_tokens(SeqId{1}), 40);
  EXPECT_TRUE(m.tables(SeqId{1}).empty());
  EXPECT_FALSE(m.can_swap_out(SeqId{1}));
  EXPECT_EQ(m.fork(SeqId{1}, SeqId{2}).code(), StatusCode::kFailedPrecondition);
  // A second sequence of the same prompt still finds the first one's published blocks.
  ASSERT_TRUE(m.add_sequence(SeqId{3}, iota_tokens(10), "").ok());
  EXPECT_EQ(m.lookup_prefix(SeqId{3}), 8);
  m.free(SeqId{1});
  m.free(SeqId{3});
  EXPECT_EQ(m.num_available_blocks(), 8);
}

TEST(KvCacheManagerDeathTest, StalePlanIsRejected) {
  KvCacheManager m(geometry(16), {}, {});
  ASSERT_TRUE(m.add_sequence(SeqId{1}, iota_tokens(4), "").ok());
  StatusOr<KvPlan> plan = m.prepare({{SeqId{1}, 4}});
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(m.add_sequence(SeqId{2}, iota_tokens(4), "").ok());
  StepCopies copies;
  EXPECT_DEATH(m.commit(std::move(plan).value(), &copies), "stale KV plan");
}

}  // namespace
}  // namespace strata::kv
