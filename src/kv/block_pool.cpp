#include "strata/kv/block_pool.h"

#include <algorithm>
#include <bit>

#include "strata/common/check.h"

namespace strata::kv {

BlockPool::BlockPool(int32_t num_blocks) : BlockPool(PageLayout(), num_blocks) {}

BlockPool::BlockPool(PageLayout layout, int32_t num_pages)
    : layout_(std::move(layout)),
      pages_(num_pages),
      refcounts_(static_cast<size_t>(num_pages) * layout_.max_blocks_per_page(), 0) {
  STRATA_CHECK(num_pages > 0) << "a block pool needs at least one page";
  free_pages_.reserve(num_pages);
  // Hand out low ids first (pop from the back).
  for (int32_t p = num_pages - 1; p >= 0; --p) free_pages_.push_back(p);
}

std::set<int32_t>& BlockPool::open_pages(const BlockKind& kind) {
  for (auto& [k, pages] : open_) {
    if (k == kind) return pages;
  }
  return open_.emplace_back(kind, std::set<int32_t>()).second;
}

int64_t BlockPool::pinned_room(const BlockKind& kind) const {
  int64_t room = 0;
  for (const auto& [k, pages] : open_) {
    if (!(k == kind)) continue;
    for (int32_t p : pages) {
      if (!is_unpinned(pages_[p])) room += std::popcount(pages_[p].free_slots);
    }
  }
  return room;
}

int32_t BlockPool::pages_for(int64_t n, const KvFormat& format, int32_t heads) const {
  const int64_t rest = n - pinned_room(layout_.kind(format, heads));
  if (rest <= 0) return 0;
  const int64_t per_page = layout_.blocks_per_page(format, heads);
  return static_cast<int32_t>((rest + per_page - 1) / per_page);
}

int32_t BlockPool::pages_pinned_by(std::span<const ChunkHash> groups) const {
  std::unordered_map<int32_t, int32_t> evictable_blocks;  // page -> blocks these groups hold there
  for (const ChunkHash& h : groups) {
    auto it = cached_.find(h);
    if (it == cached_.end() || it->second.users > 0) continue;
    for (BlockId b : it->second.distinct) ++evictable_blocks[layout_.page_of(b)];
  }
  int32_t pinned = 0;
  for (const auto& [page, count] : evictable_blocks) {
    if (is_unpinned(pages_[page])) ++pinned;
  }
  return pinned;
}

void BlockPool::update_page(int32_t page, int32_t used_delta, int32_t evictable_delta) {
  Page& p = pages_[page];
  const bool was_unpinned = is_unpinned(p);
  const bool was_open = p.used > 0 && p.used < p.capacity;
  p.used += used_delta;
  p.evictable += evictable_delta;
  STRATA_CHECK(p.used >= 0 && p.evictable >= 0 && p.evictable <= p.used) << "page " << page;
  num_evictable_pages_ += static_cast<int32_t>(is_unpinned(p)) - static_cast<int32_t>(was_unpinned);
  const bool is_open = p.used > 0 && p.used < p.capacity;
  if (was_open != is_open) {
    std::set<int32_t>& open = open_pages(p.kind);
    if (is_open) {
      open.insert(page);
    } else {
      open.erase(page);
    }
  }
  if (p.used == 0 && used_delta < 0) {
    p.capacity = 0;
    free_pages_.push_back(page);
  }
}

std::vector<BlockId> BlockPool::allocate(int32_t n, KvFormat format, int32_t heads) {
  STRATA_CHECK(pages_for(n, format, heads) <= num_available_pages())
      << "allocate(" << n << ") of " << format_name(format) << " with " << num_available()
      << " blocks available";
  const BlockKind kind = layout_.kind(format, heads);
  const int32_t per_page = layout_.blocks_per_page(format, heads);
  const int64_t bytes = layout_.block_bytes(format, heads);
  std::vector<BlockId> blocks;
  blocks.reserve(n);
  while (static_cast<int32_t>(blocks.size()) < n) {
    int32_t page = -1;
    for (int32_t p : open_pages(kind)) {
      if (!is_unpinned(pages_[p])) {
        page = p;
        break;
      }
    }
    if (page < 0) {
      if (free_pages_.empty()) {
        evict_one();
        continue;
      }
      page = free_pages_.back();
      free_pages_.pop_back();
      Page& fresh = pages_[page];
      fresh.kind = kind;
      fresh.capacity = per_page;
      fresh.free_slots = per_page == 64 ? ~uint64_t{0} : (uint64_t{1} << per_page) - 1;
    }
    Page& p = pages_[page];
    const int32_t slot = std::countr_zero(p.free_slots);
    p.free_slots &= p.free_slots - 1;
    const BlockId block = layout_.block(page, slot);
    refcounts_[block.value] = 1;
    used_bytes_ += bytes;
    update_page(page, +1, 0);
    blocks.push_back(block);
  }
  return blocks;
}

void BlockPool::retain(BlockId block) {
  STRATA_CHECK(refcounts_[block.value] > 0) << "retain of free block " << block.value;
  ++refcounts_[block.value];
}

void BlockPool::release(BlockId block) {
  STRATA_CHECK(refcounts_[block.value] > 0) << "release of free block " << block.value;
  if (--refcounts_[block.value] > 0) return;
  const int32_t page = layout_.page_of(block);
  pages_[page].free_slots |= uint64_t{1} << layout_.slot_of(block);
  used_bytes_ -= layout_.block_bytes(pages_[page].kind.format, pages_[page].kind.heads);
  update_page(page, -1, 0);
}

bool BlockPool::insert_cached(const ChunkHash& hash, std::span<const BlockId> blocks) {
  if (cached_.contains(hash)) return false;
  CachedGroup group{{blocks.begin(), blocks.end()}, {}, /*users=*/1, lru_.end()};
  for (BlockId b : blocks) {
    if (std::find(group.distinct.begin(), group.distinct.end(), b) != group.distinct.end())
      continue;
    group.distinct.push_back(b);
    retain(b);
  }
  cached_.emplace(hash, std::move(group));
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
    for (BlockId b : group.distinct) update_page(layout_.page_of(b), 0, -1);
  }
}

void BlockPool::release_cached(const ChunkHash& hash) {
  auto it = cached_.find(hash);
  STRATA_CHECK(it != cached_.end()) << "release of an uncached group";
  CachedGroup& group = it->second;
  STRATA_CHECK(group.users > 0) << "release of a group without users";
  if (--group.users == 0) {
    group.lru_position = lru_.insert(lru_.end(), hash);
    for (BlockId b : group.distinct) {
      STRATA_CHECK_EQ(refcounts_[b.value], 1) << "a group without users has a referenced block";
      update_page(layout_.page_of(b), 0, +1);
    }
  }
}

void BlockPool::evict_one() {
  STRATA_CHECK(!lru_.empty()) << "no evictable group";
  auto it = cached_.find(lru_.front());
  lru_.pop_front();
  for (BlockId b : it->second.distinct) {
    update_page(layout_.page_of(b), 0, -1);
    release(b);
  }
  cached_.erase(it);
  ++num_evicted_groups_;
}

}  // namespace strata::kv
