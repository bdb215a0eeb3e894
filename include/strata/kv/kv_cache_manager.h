// The paged KV cache's bookkeeping: per-sequence, per-layer page tables over a BlockPool, prefix
// caching by chained content hash, reference counts with copy-on-write, and a prepare-then-commit
// API so the scheduler can ask whether a step fits without changing anything.
//
// Lifecycle of a sequence:
//   add_sequence(prompt) -> [lookup_prefix] -> prepare({seq, n}) -> commit -> executor writes KV
//   -> mark_computed(seq, n) -> append_tokens(sampled) -> prepare ... -> free(seq)
// A sequence without blocks attaches the longest cached prefix of full blocks when it is first
// committed (always leaving at least one token to compute, whose logits the step needs).
// A sequence may be swapped out to the host pool (its tables then name host blocks) and back in
// by the next plan that schedules it. A sequence whose KV the executor moved out of the pool
// (LeanKV's compressed pages) is *off the pool* from move_off_pool on: it holds no blocks, its
// tables stay empty and its later steps need none.
//
// Page tables: tables(seq)[t][i] is the block holding tokens [i*B, (i+1)*B) of table t,
// B = block_size_tokens: with the default layout table t is layer t; with KvLayout::head_groups G
// table layer * G + g holds the blocks of the layer's g-th group of num_kv_heads / G KV heads. A
// table's blocks are in the format the layout gives it (the pool's base format by default). The
// tables of a layer that shares another's blocks (KvLayout::shared_with) equal its owner's; each
// table entry holds one reference on its block.
// Capacity is counted in pages (page_layout.h): a plan fits when the pages its new blocks need, by
// kind (format, heads), are available; num_blocks() and num_available_blocks() give pages in base
// blocks.
//
// Not thread-safe: one owner (the scheduler's thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/kv/block_pool.h"
#include "strata/kv/kv_types.h"
#include "strata/kv/page_layout.h"

namespace strata::kv {

struct PrefixCacheOptions {
  bool enabled = true;
  uint64_t model_fingerprint = 0;  // distinguishes models (and weights) sharing a pool or store
};

// KV space one sequence needs in a step: positions [num_computed, num_computed + n) of its tokens.
struct KvRequest {
  SeqId seq;
  int64_t num_new_tokens = 0;
};

struct PrefixCacheStats {
  int64_t lookup_tokens = 0;  // prompt tokens of sequences admitted with prefix caching on
  int64_t hit_tokens = 0;     // of those, tokens served from cached blocks
};

// What prepare() decided; apply with commit(). Dropping it changes nothing.
class KvPlan {
 public:
  int32_t num_blocks_needed() const { return num_blocks_needed_; }

 private:
  friend class KvCacheManager;
  struct Attach {
    SeqId seq;
    std::vector<ChunkHash> hashes;  // cached groups, in token-block order
  };
  uint64_t generation_ = 0;
  std::vector<KvRequest> requests_;
  std::vector<Attach> attaches_;
  int32_t num_blocks_needed_ = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(const KvGeometry& geometry, KvFormat format, PrefixCacheOptions prefix);

  const KvGeometry& geometry() const { return geometry_; }
  KvFormat format() const { return format_; }

  // Registers a sequence with no blocks. INVALID_ARGUMENT if the id is in use or prompt is empty.
  // A sequence that is not `cacheable` neither uses nor publishes to the prefix cache (it must
  // compute every token, e.g. to score its prompt). `layout` gives the KV head groups (page tables
  // per layer), each table's format (a kind the pool holds) and the layers that share an earlier
  // layer's blocks; INVALID_ARGUMENT naming the layer otherwise. Only sequences of the same layout
  // share cached prefixes.
  Status add_sequence(SeqId seq, std::vector<TokenId> prompt, std::string tenant_salt,
                      bool cacheable = true, KvLayout layout = {});
  // Appends tokens (e.g. the sampled one) whose KV a later step computes.
  void append_tokens(SeqId seq, std::span<const TokenId> tokens);
  // Declares that the first num_blocks token blocks of a sequence without blocks can be loaded
  // (from the KV store) instead of computed: the first commit allocates them and appends a
  // BlockLoad for those the prefix cache does not cover. REQUIRES num_blocks * block size <
  // tokens. With exact == false the loaded KV is not what computing the tokens gives (truncated,
  // re-rotated history): the sequence then neither uses nor publishes to the prefix cache.
  void set_external_prefix(SeqId seq, int64_t num_blocks, bool exact);
  // Tokens a prefix-cache hit or an external prefix would provide if `seq` were committed now:
  // 0 once it has blocks.
  int64_t lookup_prefix(SeqId seq) const;

  // Plans the blocks for one step. Requests name distinct, known sequences, and each n must fit
  // in the sequence's known tokens after its prefix hit (checked). RESOURCE_EXHAUSTED when the
  // pool cannot hold them; nothing changes either way.
  StatusOr<KvPlan> prepare(std::vector<KvRequest> requests) const;
  // Applies a plan; REQUIRES no mutation since its prepare(). Swapped-out sequences in it are
  // swapped back in. Appends the copies to perform to copies->swap_in and copies->device.
  void commit(KvPlan&& plan, StepCopies* copies);
  // Whether the host pool can take all of `seq`'s blocks now.
  bool can_swap_out(SeqId seq) const;
  // Moves a sequence's KV to host blocks (REQUIRES can_swap_out), freeing its device blocks;
  // appends the copies to copies->swap_out. The sequence keeps its tokens and computed count.
  void swap_out(SeqId seq, StepCopies* copies);
  bool is_swapped(SeqId seq) const { return get(seq).swapped; }
  // The executor holds the sequence's KV outside the pool from now on: frees its blocks (cached
  // ones stay cached); later plans allocate none for it and mark_computed only counts. REQUIRES
  // not swapped out. Undone only by free() (a recomputed sequence is added again).
  void move_off_pool(SeqId seq);
  bool is_off_pool(SeqId seq) const { return get(seq).off_pool; }
  // The executor wrote KV for the next n tokens: publishes newly full blocks to the prefix cache.
  void mark_computed(SeqId seq, int64_t num_tokens);
  // Releases a sequence (unknown ids are ignored). Its published blocks stay cached.
  void free(SeqId seq);
  // Creates `child` sharing all of `parent`'s blocks and tokens. INVALID_ARGUMENT if parent is
  // unknown or child exists; FAILED_PRECONDITION if parent is swapped out or off the pool.
  Status fork(SeqId parent, SeqId child);

  bool has_sequence(SeqId seq) const { return sequences_.contains(seq); }
  // As given to add_sequence (empty vectors for the default layout).
  const KvLayout& layout(SeqId seq) const;
  const std::vector<std::vector<BlockId>>& tables(SeqId seq) const { return get(seq).tables; }
  const std::vector<TokenId>& tokens(SeqId seq) const { return get(seq).tokens; }
  int64_t num_computed_tokens(SeqId seq) const { return get(seq).num_computed; }
  // Prompt tokens this sequence took from the prefix cache when it was admitted.
  int64_t num_prefix_hit_tokens(SeqId seq) const { return get(seq).num_prefix_hit; }
  // Prompt tokens it loaded from outside (set_external_prefix) beyond the prefix-cache hit.
  int64_t num_loaded_tokens(SeqId seq) const { return get(seq).num_loaded; }

  int32_t num_blocks() const { return pool_.num_blocks(); }
  // Blocks a plan may use: free plus evictable cached ones.
  int32_t num_available_blocks() const { return pool_.num_available(); }
  int32_t num_cached_groups() const { return pool_.num_cached_groups(); }
  const PageLayout& page_layout() const { return pool_.layout(); }
  int64_t capacity_bytes() const { return pool_.capacity_bytes(); }
  int64_t used_bytes() const { return pool_.used_bytes(); }  // bytes of allocated device blocks
  // Cached token blocks (one group: the block of every layer) evicted to make room.
  int64_t num_evicted_groups() const { return pool_.num_evicted_groups(); }
  int32_t num_host_blocks() const { return host_pool_ ? host_pool_->num_blocks() : 0; }
  int32_t num_free_host_blocks() const { return host_pool_ ? host_pool_->num_free() : 0; }
  int32_t refcount(BlockId block) const { return pool_.refcount(block); }
  PrefixCacheStats prefix_stats() const { return stats_; }

 private:
  struct Sequence {
    std::vector<TokenId> tokens;
    std::string tenant_salt;
    int64_t num_computed = 0;
    int64_t num_prefix_hit = 0;
    int64_t external_blocks = 0;  // leading blocks loadable from outside (set_external_prefix)
    int64_t num_loaded = 0;
    bool cacheable = true;  // uses and publishes to the prefix cache
    std::vector<std::vector<BlockId>> tables;  // [layer][token block]
    std::vector<ChunkHash> groups;             // cached groups this sequence uses (users += 1)
    int64_t num_hashed_blocks = 0;             // full blocks whose hash is known
    ChunkHash last_hash;                       // hash of block num_hashed_blocks - 1 (or root)
    bool swapped = false;                      // tables name host-pool blocks
    bool off_pool = false;                     // KV outside the pool (move_off_pool)
    KvLayout layout;                           // as given
    int32_t groups_per_layer = 1;              // KV head groups: tables per layer
    int32_t heads = 0;                         // KV heads per block (0: all)
    std::vector<KvFormat> formats;             // per table
    std::vector<int32_t> owners;               // per table: the table whose blocks it uses
  };

  const Sequence& get(SeqId seq) const;
  Sequence& get(SeqId seq);
  int64_t num_token_blocks(const Sequence& s) const {
    return s.tables.empty() ? 0 : static_cast<int64_t>(s.tables[0].size());
  }
  // Fills s.groups_per_layer, heads, formats and owners from a layout; INVALID_ARGUMENT naming
  // what the pool cannot hold.
  Status apply_layout(const KvLayout& layout, Sequence& s) const;
  // The layout as text for the prefix root: "groups1;int8/token64;int8/token64=0;...".
  static std::string layout_name(const Sequence& s);
  // Whether the block of an owner table is referenced beyond that sequence's own entries.
  bool is_shared(const Sequence& s, int64_t table, int64_t token_block) const;
  // per_kind[kind of s's table] += n (indexed like PageLayout::kinds()).
  void count(std::vector<int64_t>& per_kind, const Sequence& s, int64_t table, int64_t n) const;
  // Pages `pool` must give for blocks counted per kind.
  static int64_t pages_for(const BlockPool& pool, const std::vector<int64_t>& per_kind);
  // Points every table entry of token block i that `owner`'s blocks back (the owner's and its
  // sharers') at `block`: releases the old block in `from`, retains the new one in `to`.
  static void set_entry(Sequence& s, int64_t owner, int64_t token_block, BlockId block,
                        BlockPool& from, BlockPool& to);
  // Moves every block of s from one pool to fresh blocks of the other, appending the copies.
  static void move_blocks(Sequence& s, BlockPool& from, BlockPool& to,
                          std::vector<BlockCopy>* copies);
  // Cached groups covering the longest full-block prefix of s.tokens, leaving >= 1 token.
  std::vector<ChunkHash> match_prefix(const Sequence& s) const;
  // Blocks of a sequence without blocks that its first commit loads (beyond `num_cached`).
  static int64_t blocks_to_load(const Sequence& s, size_t num_cached) {
    return std::max<int64_t>(0, s.external_blocks - static_cast<int64_t>(num_cached));
  }

  KvGeometry geometry_;
  KvFormat format_;
  PrefixCacheOptions prefix_;
  BlockPool pool_;
  std::unique_ptr<BlockPool> host_pool_;  // null when num_host_blocks == 0
  std::unordered_map<SeqId, Sequence> sequences_;
  uint64_t generation_ = 0;  // bumped by every mutation; plans must match it
  PrefixCacheStats stats_;
};

}  // namespace strata::kv
