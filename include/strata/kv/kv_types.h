// Vocabulary of the paged KV cache: block ids, per-block formats, geometry, content hashes.
//
// A *block* holds the keys and values of block_size_tokens consecutive token positions for all KV
// heads of ONE layer, in a page format (kv_format.h). Blocks of every layer come from one pool of
// fixed-byte pages (page_layout.h), so two layers' page tables may point at the same block
// (cross-layer sharing) and a layer that shares needs no blocks of its own.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/kv/kv_format.h"

namespace strata::kv {

struct BlockId {
  int32_t value = -1;
  auto operator<=>(const BlockId&) const = default;
};

// A block the executor must copy before the step (copy-on-write of a shared partial block, a swap
// between the device and host pools): both blocks are in `format`, with `heads` KV heads (0: all).
struct BlockCopy {
  BlockId source;
  BlockId destination;
  KvFormat format;
  int32_t heads = 0;
};

// Token blocks [first_block, first_block + num_blocks) of a sequence whose KV comes from outside
// the pool (the KV store) instead of being computed: their blocks are allocated, and the engine
// has them filled before the step's attention reads them.
struct BlockLoad {
  SeqId seq;
  int64_t first_block = 0;
  int64_t num_blocks = 0;
};

// Copies the executor performs before a step, in this order: swap-outs (device -> host blocks),
// swap-ins (host -> device), then device copies (copy-on-write); and the loads the step needs.
struct StepCopies {
  std::vector<BlockCopy> swap_out;
  std::vector<BlockCopy> swap_in;
  std::vector<BlockCopy> device;
  std::vector<BlockLoad> loads;

  bool has_block_moves() const { return !swap_out.empty() || !swap_in.empty() || !device.empty(); }
};

struct KvGeometry {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size_tokens = 16;
  // Capacity of the device pool, in blocks of its base format (the compute dtype's plain format):
  // num_blocks / page_blocks pages.
  int32_t num_blocks = 0;
  // Blocks of the host (pinned DRAM) pool that preempted sequences swap to, counted alike; 0
  // disables swapping.
  int32_t num_host_blocks = 0;
  // Base blocks per page (divides num_blocks and num_host_blocks); a page holds more blocks of a
  // smaller format (page_layout.h).
  int32_t page_blocks = 1;
  // Formats besides the base one that blocks may take (a sequence's KvLayout picks among them).
  std::vector<KvFormat> formats = {};
  // Numbers of KV head groups besides 1 that a sequence's layout may split a layer into (each
  // divides num_kv_heads); every format then also comes in blocks of num_kv_heads / G heads.
  std::vector<int32_t> head_groups = {};

  // INVALID_ARGUMENT naming the first non-positive field.
  Status validate() const;
};

// How one sequence's KV is laid out in the pool. Each layer's KV heads are split into head_groups
// groups of num_kv_heads / head_groups heads, each with its own page table (per-KV-head tables;
// table t = layer * head_groups + group, holding blocks of that group's heads only). Each table
// has a format; a layer may read another layer's blocks instead of having its own (cross-layer
// sharing: its tables alias the owner's, and its own keys and values are never written). Empty
// vectors and one group mean every layer in the pool's base format with its own blocks.
struct KvLayout {
  std::vector<KvFormat> formats = {};     // per table, or empty
  std::vector<int32_t> shared_with = {};  // per layer: -1, or the earlier layer it reads
  int32_t head_groups = 1;

  bool is_default() const { return formats.empty() && shared_with.empty() && head_groups == 1; }
  bool operator==(const KvLayout&) const = default;
};

// 128-bit content identity of a token block given everything before it (see prefix_hash.h).
struct ChunkHash {
  uint64_t low = 0;
  uint64_t high = 0;
  auto operator<=>(const ChunkHash&) const = default;
};

}  // namespace strata::kv

template <>
struct std::hash<strata::kv::ChunkHash> {
  size_t operator()(const strata::kv::ChunkHash& h) const noexcept { return h.low; }
};
