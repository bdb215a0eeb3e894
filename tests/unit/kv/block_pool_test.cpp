#include "strata/kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>

namespace strata::kv {
namespace {

constexpr KvFormat kBf16{};

ChunkHash hash_of(uint64_t v) { return {v, ~v}; }

TEST(BlockPoolTest, AllocateReleaseRoundTrip) {
  BlockPool pool(8);
  std::vector<BlockId> a = pool.allocate(5, kBf16);
  EXPECT_EQ(pool.num_free(), 3);
  std::set<int32_t> distinct;
  for (BlockId b : a) {
    EXPECT_EQ(pool.refcount(b), 1);
    distinct.insert(b.value);
  }
  EXPECT_EQ(distinct.size(), 5u);
  pool.retain(a[0]);
  pool.release(a[0]);
  EXPECT_EQ(pool.refcount(a[0]), 1);
  for (BlockId b : a) pool.release(b);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(BlockPoolTest, CachedGroupsAreEvictedLeastRecentlyUsedFirst) {
  BlockPool pool(6);
  std::vector<BlockId> g1 = pool.allocate(2, kBf16);
  std::vector<BlockId> g2 = pool.allocate(2, kBf16);
  ASSERT_TRUE(pool.insert_cached(hash_of(1), g1));
  ASSERT_TRUE(pool.insert_cached(hash_of(2), g2));
  EXPECT_FALSE(pool.insert_cached(hash_of(1), g2)) << "a hash is cached once";
  // The sequences that computed them finish: table references go, then the groups lose users.
  for (BlockId b : g1) pool.release(b);
  for (BlockId b : g2) pool.release(b);
  EXPECT_EQ(pool.num_available(), 2);  // still in use by their one user each
  pool.release_cached(hash_of(2));
  pool.release_cached(hash_of(1));  // group 1 becomes the most recently used
  EXPECT_EQ(pool.num_available(), 6);
  EXPECT_EQ(pool.num_free(), 2);

  // Needing 4 blocks: 2 free, then evict the LRU group (2), keep group 1.
  EXPECT_EQ(pool.num_evicted_groups(), 0);
  std::vector<BlockId> taken = pool.allocate(4, kBf16);
  EXPECT_EQ(pool.find_cached(hash_of(2)), nullptr);
  ASSERT_NE(pool.find_cached(hash_of(1)), nullptr);
  EXPECT_EQ(pool.num_evicted_groups(), 1);
  EXPECT_EQ(pool.num_available(), 2);

  // A group in use cannot be evicted.
  pool.acquire_cached(hash_of(1));
  EXPECT_EQ(pool.num_available(), 0);
  EXPECT_FALSE(pool.is_evictable(hash_of(1)));
  pool.release_cached(hash_of(1));
  EXPECT_TRUE(pool.is_evictable(hash_of(1)));
  for (BlockId b : taken) pool.release(b);
  EXPECT_EQ(pool.num_available(), 6);
}

TEST(BlockPoolDeathTest, MisuseIsCaught) {
  BlockPool pool(2);
  EXPECT_DEATH(pool.allocate(3, kBf16), "blocks available");
  std::vector<BlockId> a = pool.allocate(1, kBf16);
  pool.release(a[0]);
  EXPECT_DEATH(pool.release(a[0]), "release of free block");
}

}  // namespace
}  // namespace strata::kv
