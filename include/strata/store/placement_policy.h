// Where a conversation's KV lives in the store, decided from the scheduler's job queue
// (CachedAttention §3.3, "scheduler-aware fetching and eviction"), with LRU and FIFO as baselines.
//
// The unit of placement is an *item*: all stored KV of one conversation (every layer, K and V).
// Tiers are host DRAM (the top tier, which loads read from) and the tiers below it (SSD, ...). An
// item occupies a tier when any of its chunks are there; prefetching copies into DRAM and keeps
// the lower copies, so an item may be in several.
//
// The queue is the list of items the waiting jobs will load, head (runs next) first. Windows are
// counted in queue entries:
//   prefetch window  L_pw = C_mem / S_kv            (DRAM available for prefetching, in items)
//   eviction window  L_ew = (C_mem + C_disk) / S_kv  (items the whole store holds)
// where S_kv is the mean item size. Rules (see docs/kv-store.md for the decisions the paper
// leaves open):
//   prefetch:     items with chunks only below DRAM whose jobs are inside the prefetch window,
//                 head first.
//   DRAM victim:  scheduler-aware: an item with no job inside the eviction window (least recently
//                 used first); else the item whose job is nearest the window's tail.
//                 LRU: least recently used. FIFO: first stored.
//   lower victim: (SSD, ...) scheduler-aware: never an item with a job inside the eviction
//                 window; items with no queued job first (least recently used first), then the one
//                 whose first job is farthest back in the queue. LRU / FIFO as above.
// Pinned items (being loaded or written) are never chosen.
//
// Pure functions over a snapshot: no I/O, no locks; table-driven tests pin every rule.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "strata/common/status.h"

namespace strata::store {

using ItemId = uint64_t;

enum class EvictionPolicy {
  kSchedulerAware,  // CachedAttention: look-ahead windows over the job queue
  kLru,
  kFifo,
};
StatusOr<EvictionPolicy> parse_eviction_policy(std::string_view name);
inline const char* eviction_policy_name(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kSchedulerAware: return "scheduler_aware";
    case EvictionPolicy::kLru: return "lru";
    case EvictionPolicy::kFifo: return "fifo";
  }
  return "unknown";
}

// What the policy needs to know about one stored item.
struct ItemView {
  ItemId id = 0;
  int64_t num_chunks = 0;
  bool in_top = false;       // holds chunks in DRAM
  bool in_lower = false;     // holds chunks in the lower tier a decision is about
  bool needs_fetch = false;  // some chunk is only below DRAM
  bool pinned = false;
  uint64_t last_access = 0;  // logical clock: larger is more recent
  uint64_t stored_at = 0;    // logical clock of the first save (FIFO order)
};

// Window length in queue entries: capacity_chunks / mean item size, at least 1 (0 when capacity
// is 0). mean_item_chunks <= 0 means "unknown" and yields `fallback`.
int64_t window_length(int64_t capacity_chunks, double mean_item_chunks, int64_t fallback);

// Items to prefetch into DRAM: items needing a fetch among the first `window` queue entries, head first,
// each once. `items` holds every stored item; queue entries naming no stored item are skipped.
std::vector<ItemId> prefetch_candidates(std::span<const ItemView> items,
                                        std::span<const ItemId> queue, int64_t window);

// The item to move out of DRAM (to SSD, or out of the store without one), or nullopt.
std::optional<ItemId> choose_top_victim(EvictionPolicy policy, std::span<const ItemView> items,
                                         std::span<const ItemId> queue, int64_t window);

// The item whose copy in a lower tier to drop to make room there, never `exclude` (the item being
// demoted), or nullopt when every candidate is exempt.
std::optional<ItemId> choose_lower_victim(EvictionPolicy policy, std::span<const ItemView> items,
                                        std::span<const ItemId> queue, int64_t window,
                                        std::optional<ItemId> exclude);

// Layers of a job's stored KV to pre-load into the read buffer before the job runs
// (CachedAttention §3.2.1): with per-layer load time t_load and per-layer compute time t_compute
// of the job's new tokens, layer j waits for nothing if (j - k) t_load <= (j - 1) t_compute for
// every j in 1..L, i.e. k >= L - (L - 1) t_compute / t_load. Rounded up, clamped to [1, L]: at
// least the first layer, whose load is otherwise a gap before the job's first layer.
int64_t read_buffer_layers(int64_t num_layers, double t_compute, double t_load);

}  // namespace strata::store
