// Reference-counted allocator over a fixed pool of KV pages (page_layout.h), with the prefix
// cache's storage: groups of blocks (one token block across all layers) kept under their content
// hash after the sequences that computed them finish, and evicted least-recently-used only when
// space is needed.
//
// Blocks: a page holds blocks of one kind, a format and a number of KV heads
// (PageLayout::blocks_per_page; `heads` 0 below means all); a block is allocated into a page of
// its kind that already has room and is pinned (below), else into a free page.
// Capacity is counted in pages, reported in base-format blocks (num_blocks(), num_available()) and
// in bytes.
//
// References: every page-table entry holds one reference on its block, and the prefix cache holds
// one on every distinct block of every cached group. A block returns to its page at zero, and a
// page with no blocks to the free list. A group's `users` counts the sequences whose tables
// contain it; a group with no users is evictable, and then each of its blocks is referenced by the
// cache alone. A page is *pinned* while it holds a block that is not evictable; pages that are not
// pinned are what eviction can free.
//
// Not thread-safe: owned by the KvCacheManager, used from the scheduler's thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "strata/kv/kv_types.h"
#include "strata/kv/page_layout.h"

namespace strata::kv {

class BlockPool {
 public:
  // num_blocks pages of one block each, of any format (a pool counted in blocks).
  explicit BlockPool(int32_t num_blocks);
  BlockPool(PageLayout layout, int32_t num_pages);

  const PageLayout& layout() const { return layout_; }
  int32_t num_pages() const { return static_cast<int32_t>(pages_.size()); }
  // In base-format blocks: pages x page_blocks.
  int32_t num_blocks() const { return num_pages() * layout_.page_blocks(); }
  int32_t num_free() const {
    return static_cast<int32_t>(free_pages_.size()) * layout_.page_blocks();
  }
  // Base-format blocks obtainable now: free pages plus those eviction can free.
  int32_t num_available() const { return num_available_pages() * layout_.page_blocks(); }
  int32_t num_available_pages() const {
    return static_cast<int32_t>(free_pages_.size()) + num_evictable_pages_;
  }
  int64_t capacity_bytes() const { return num_pages() * layout_.page_bytes(); }
  int64_t used_bytes() const { return used_bytes_; }  // bytes of allocated blocks
  int32_t num_cached_groups() const { return static_cast<int32_t>(cached_.size()); }
  int64_t num_evicted_groups() const { return num_evicted_groups_; }  // since construction

  // Pages that allocating n more blocks of a kind takes from num_available_pages(): the blocks
  // that do not fit in pinned pages of that kind, in whole pages.
  int32_t pages_for(int64_t n, const KvFormat& format, int32_t heads = 0) const;
  // Available pages that acquiring these evictable groups would pin.
  int32_t pages_pinned_by(std::span<const ChunkHash> groups) const;

  // Takes n blocks of a kind, each with refcount 1, evicting unused cached groups (least recently
  // used first) when free pages run short. REQUIRES pages_for(n, format, heads) <=
  // num_available_pages().
  std::vector<BlockId> allocate(int32_t n, KvFormat format, int32_t heads = 0);
  void retain(BlockId block);
  // Drops one reference; at zero the block is free again.
  void release(BlockId block);
  int32_t refcount(BlockId block) const { return refcounts_[block.value]; }
  KvFormat format(BlockId block) const { return pages_[layout_.page_of(block)].kind.format; }
  int32_t heads(BlockId block) const { return pages_[layout_.page_of(block)].kind.heads; }

  // --- prefix cache storage ---
  // Caches `blocks` (one per layer; layers that share a block name it twice) under `hash` with
  // one user (the caller), taking a reference on each distinct block. Returns false (and changes
  // nothing) if the hash is already cached.
  bool insert_cached(const ChunkHash& hash, std::span<const BlockId> blocks);
  // The blocks cached under `hash`, one per layer, or nullptr.
  const std::vector<BlockId>* find_cached(const ChunkHash& hash) const;
  // True if the group exists and no sequence uses it (acquiring it takes blocks off
  // num_available()).
  bool is_evictable(const ChunkHash& hash) const;
  // users += 1 (the group leaves the eviction list). REQUIRES the hash is cached.
  void acquire_cached(const ChunkHash& hash);
  // users -= 1; at zero the group becomes the most recently used evictable group.
  void release_cached(const ChunkHash& hash);

 private:
  struct Page {
    BlockKind kind;
    int32_t capacity = 0;     // blocks of `kind` it holds; 0 while free
    int32_t used = 0;         // blocks with refcount > 0
    int32_t evictable = 0;    // of those, blocks of evictable cached groups
    uint64_t free_slots = 0;  // bit s: slot s is unused
  };
  struct CachedGroup {
    std::vector<BlockId> blocks;    // per layer
    std::vector<BlockId> distinct;  // each block once
    int32_t users = 0;
    std::list<ChunkHash>::iterator lru_position;  // valid only while users == 0
  };
  static bool is_unpinned(const Page& p) { return p.used > 0 && p.used == p.evictable; }
  // Applies a change to a page's counts, keeping num_evictable_pages_ and the open sets right.
  void update_page(int32_t page, int32_t used_delta, int32_t evictable_delta);
  std::set<int32_t>& open_pages(const BlockKind& kind);
  // Free slots of pinned pages of `kind`.
  int64_t pinned_room(const BlockKind& kind) const;
  void evict_one();

  PageLayout layout_;
  std::vector<Page> pages_;
  std::vector<int32_t> refcounts_;   // per block id
  std::vector<int32_t> free_pages_;  // pages without blocks (used as a stack)
  // Per kind, pages with blocks and free slots.
  std::vector<std::pair<BlockKind, std::set<int32_t>>> open_;
  int32_t num_evictable_pages_ = 0;  // pages with blocks, none pinned
  int64_t used_bytes_ = 0;
  std::unordered_map<ChunkHash, CachedGroup> cached_;
  std::list<ChunkHash> lru_;  // groups with users == 0, least recently used first
  int64_t num_evicted_groups_ = 0;
};

}  // namespace strata::kv
