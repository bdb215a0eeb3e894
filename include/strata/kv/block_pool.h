// Reference-counted allocator over a fixed pool of KV blocks, with the prefix cache's storage:
// groups of blocks (one token block across all layers) kept under their content hash after the
// sequences that computed them finish, and evicted least-recently-used only when space is needed.
//
// References: every page-table entry holds one reference on its block, and the prefix cache holds
// one on every block of every cached group. A block returns to the free list when its count drops
// to zero. A group's `users` counts the sequences whose tables contain it; a group with no users
// is evictable, and then each of its blocks is referenced by the cache alone.
//
// Not thread-safe: owned by the KvCacheManager, used from the scheduler's thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "strata/kv/kv_types.h"

namespace strata::kv {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(refcounts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_list_.size()); }
  // Blocks obtainable now: free ones plus those of cached groups no sequence uses.
  int32_t num_available() const { return num_free() + num_evictable_blocks_; }
  int32_t num_cached_groups() const { return static_cast<int32_t>(cached_.size()); }
  int64_t num_evicted_groups() const { return num_evicted_groups_; }  // since construction

  // Takes n blocks, each with refcount 1 and the given format, evicting unused cached groups
  // (least recently used first) when the free list runs short. REQUIRES n <= num_available().
  std::vector<BlockId> allocate(int32_t n, KvFormat format);
  void retain(BlockId block);
  // Drops one reference; at zero the block is free again.
  void release(BlockId block);
  int32_t refcount(BlockId block) const { return refcounts_[block.value]; }
  KvFormat format(BlockId block) const { return formats_[block.value]; }

  // --- prefix cache storage ---
  // Caches `blocks` under `hash` with one user (the caller), taking a reference on each block.
  // Returns false (and changes nothing) if the hash is already cached.
  bool insert_cached(const ChunkHash& hash, std::span<const BlockId> blocks);
  // The blocks cached under `hash`, or nullptr.
  const std::vector<BlockId>* find_cached(const ChunkHash& hash) const;
  // True if the group exists and no sequence uses it (acquiring it takes blocks off
  // num_available()).
  bool is_evictable(const ChunkHash& hash) const;
  // users += 1 (the group leaves the eviction list). REQUIRES the hash is cached.
  void acquire_cached(const ChunkHash& hash);
  // users -= 1; at zero the group becomes the most recently used evictable group.
  void release_cached(const ChunkHash& hash);

 private:
  struct CachedGroup {
    std::vector<BlockId> blocks;
    int32_t users = 0;
    std::list<ChunkHash>::iterator lru_position;  // valid only while users == 0
  };
  void evict_one();

  std::vector<int32_t> refcounts_;  // per block
  std::vector<KvFormat> formats_;  // per block, set at allocation
  std::vector<int32_t> free_list_;  // blocks with refcount 0 (used as a stack)
  std::unordered_map<ChunkHash, CachedGroup> cached_;
  std::list<ChunkHash> lru_;  // groups with users == 0, least recently used first
  int32_t num_evictable_blocks_ = 0;  // sum of blocks.size() over groups in lru_
  int64_t num_evicted_groups_ = 0;
};

}  // namespace strata::kv
