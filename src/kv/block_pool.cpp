#include "strata/kv/block_pool.h"

#include "strata/common/check.h"

namespace strata::kv {

BlockPool::BlockPool(int32_t num_blocks) : refcounts_(num_blocks, 0), formats_(num_blocks) {
  STRATA_CHECK(num_blocks > 0) << "a block pool needs at least one block";
  free_list_.reserve(num_blocks);
  // Hand out low ids first (pop from the back).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

std::vector<BlockId> BlockPool::allocate(int32_t n, KvFormat format) {
  STRATA_CHECK(n <= num_available()) << "allocate(" << n << ") with " << num_available()
                                     << " blocks available";
  std::vector<BlockId> blocks;
  blocks.reserve(n);
  while (static_cast<int32_t>(blocks.size()) < n) {
    if (free_list_.empty()) evict_one();
    const int32_t b = free_list_.back();
    free_list_.pop_back();
    refcounts_[b] = 1;
    formats_[b] = format;
    blocks.push_back(BlockId{b});
  }
  return blocks;
}

void BlockPool::retain(BlockId block) {
  STRATA_CHECK(refcounts_[block.value] > 0) << "retain of free block " << block.value;
  ++refcounts_[block.value];
}

void BlockPool::release(BlockId block) {
  STRATA_CHECK(refcounts_[block.value] > 0) << "release of free block " << block.value;
  if (--refcounts_[block.value] == 0) free_list_.push_back(block.value);
}

bool BlockPool::insert_cached(const ChunkHash& hash, std::span<const BlockId> blocks) {
  if (cached_.contains(hash)) return false;
  for (BlockId b : blocks) retain(b);
  cached_.emplace(hash, CachedGroup{{blocks.begin(), blocks.end()}, /*users=*/1, lru_.end()});
  return true;
}

const std::vector<BlockId>* BlockPool::find_cached(const ChunkHash& hash) const {
  auto it = cached_.find(hash);
  return it == cached_.end() ? nullptr : &it->second.blocks;
}

bool BlockPool::is_evictable(const ChunkHash& hash) const {
  auto it = cached_.find(hash);
  return it != cached_.end() && it->second.users == 0;
}

void BlockPool::acquire_cached(const ChunkHash& hash) {
  auto it = cached_.find(hash);
  STRATA_CHECK(it != cached_.end()) << "acquire of an uncached group";
  CachedGroup& group = it->second;
  if (group.users++ == 0) {
    lru_.erase(group.lru_position);
    num_evictable_blocks_ -= static_cast<int32_t>(group.blocks.size());
  }
}

void BlockPool::release_cached(const ChunkHash& hash) {
  auto it = cached_.find(hash);
  STRATA_CHECK(it != cached_.end()) << "release of an uncached group";
  CachedGroup& group = it->second;
  STRATA_CHECK(group.users > 0) << "release of a group without users";
  if (--group.users == 0) {
    group.lru_position = lru_.insert(lru_.end(), hash);
    num_evictable_blocks_ += static_cast<int32_t>(group.blocks.size());
  }
}

void BlockPool::evict_one() {
  STRATA_CHECK(!lru_.empty()) << "no evictable group";
  auto it = cached_.find(lru_.front());
  lru_.pop_front();
  for (BlockId b : it->second.blocks) {
    STRATA_CHECK_EQ(refcounts_[b.value], 1) << "evictable block still referenced";
    release(b);
  }
  num_evictable_blocks_ -= static_cast<int32_t>(it->second.blocks.size());
  cached_.erase(it);
  ++num_evicted_groups_;
}

}  // namespace strata::kv
