// The KV pool as pages of fixed bytes (LeanKV's unified pages). A page holds blocks of one format:
// page_blocks blocks of the pool's base format (the compute dtype's plain format, what the paged
// attention kernels read), or page_bytes / block_bytes(f) blocks of a smaller format f, so a
// quantized block costs its own bytes, not a base block's. A page takes its format when its first
// block is allocated and is free again when its last block is.
//
// Block ids: page * max_blocks_per_page() + slot. A base-format block is also an index into the
// pool viewed as base blocks, [num_pages * page_blocks, 2 (K, V), num_kv_heads, block_size_tokens,
// head_dim] in the compute dtype: base_index(). With page_blocks == 1 and no other format (the
// default) a block id is that index, as before pages existed.
//
// Byte layout of a page: its blocks one after the other, block_bytes(f) each (kv_format.h gives
// the layout inside a block); the rest of the page is unused.
//
// Per-KV-head tables: a sequence may split each layer's KV heads into groups with a table each
// (kv::KvLayout::head_groups); a block of such a table holds only its group's heads, so a page's
// blocks are of one *kind*: a format and a number of heads. `heads` 0 below means all KV heads.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/common/status.h"
#include "strata/kv/kv_format.h"
#include "strata/kv/kv_types.h"

namespace strata::kv {

// What the blocks of one page are: a format, and the KV heads each block holds.
struct BlockKind {
  KvFormat format;
  int32_t heads = 0;
  bool operator==(const BlockKind&) const = default;
};

class PageLayout {
 public:
  // One block per page whatever its format: a pool counted in blocks, not bytes.
  PageLayout() = default;

  // Kinds: every format (base and others) with all KV heads, and with num_kv_heads / G heads for
  // each G of `head_groups`. INVALID_ARGUMENT if a format fails validate() for this geometry,
  // page_blocks < 1, a G does not divide num_kv_heads, or a kind's block is larger than a page or
  // packs more than 64 to one. `others` may repeat `base`; duplicates are dropped.
  static StatusOr<PageLayout> create(KvFormat base, std::vector<KvFormat> others,
                                     int32_t page_blocks, int64_t num_kv_heads,
                                     int64_t block_size_tokens, int64_t head_dim,
                                     std::vector<int32_t> head_groups = {});
  // create() from a geometry's page_blocks and formats; CHECK-fails on what create() refuses.
  static PageLayout of(const KvGeometry& geometry, const KvFormat& base);

  const KvFormat& base() const { return formats_.front(); }
  // base() first, then the others.
  const std::vector<KvFormat>& formats() const { return formats_; }
  // Every kind a page may hold, {base(), all heads} first; heads resolved (never 0).
  const std::vector<BlockKind>& kinds() const { return kinds_; }
  BlockKind kind(const KvFormat& format, int32_t heads = 0) const {
    return {format, heads == 0 ? num_kv_heads_ : heads};
  }
  bool holds(const KvFormat& format, int32_t heads = 0) const;
  int32_t num_kv_heads() const { return num_kv_heads_; }
  int32_t page_blocks() const { return page_blocks_; }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t block_bytes(const KvFormat& format, int32_t heads = 0) const;
  // Blocks of a kind one page holds. REQUIRES holds(format, heads) (anything for the default
  // layout: one).
  int32_t blocks_per_page(const KvFormat& format, int32_t heads = 0) const;
  int32_t max_blocks_per_page() const { return stride_; }

  int32_t page_of(BlockId block) const { return block.value / stride_; }
  int32_t slot_of(BlockId block) const { return block.value % stride_; }
  BlockId block(int32_t page, int32_t slot) const { return BlockId{page * stride_ + slot}; }
  // Bytes from the pool's start to the block (of that kind).
  int64_t byte_offset(BlockId block, const KvFormat& format, int32_t heads = 0) const {
    return page_of(block) * page_bytes_ + slot_of(block) * block_bytes(format, heads);
  }
  // Index of a base-format block in the pool viewed as base blocks.
  int64_t base_index(BlockId block) const {
    return int64_t{page_of(block)} * page_blocks_ + slot_of(block);
  }

 private:
  // Index of a kind in kinds_; CHECK-fails for one the layout does not hold.
  size_t index_of(const KvFormat& format, int32_t heads) const;

  std::vector<KvFormat> formats_ = {KvFormat{}};
  std::vector<BlockKind> kinds_;
  std::vector<int64_t> block_bytes_;  // per kind; empty for the default layout
  std::vector<int32_t> blocks_per_page_;
  int32_t num_kv_heads_ = 0;
  int32_t page_blocks_ = 1;
  int64_t page_bytes_ = 0;
  int32_t stride_ = 1;
};

}  // namespace strata::kv
