#include "strata/store/placement_policy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

namespace strata::store {
namespace {

// Queue position of each item's first job (head = 0), over the whole queue.
std::unordered_map<ItemId, int64_t> first_positions(std::span<const ItemId> queue) {
  std::unordered_map<ItemId, int64_t> first;
  for (size_t i = 0; i < queue.size(); ++i) first.emplace(queue[i], static_cast<int64_t>(i));
  return first;
}

bool less_recently_used(const ItemView& a, const ItemView& b) {
  return a.last_access != b.last_access ? a.last_access < b.last_access : a.id < b.id;
}

bool stored_earlier(const ItemView& a, const ItemView& b) {
  return a.stored_at != b.stored_at ? a.stored_at < b.stored_at : a.id < b.id;
}

// The candidate first in `order`, or nullopt.
template <typename Pred, typename Order>
std::optional<ItemId> pick(std::span<const ItemView> items, Pred eligible, Order order) {
  const ItemView* best = nullptr;
  for (const ItemView& item : items) {
    if (!eligible(item)) continue;
    if (best == nullptr || order(item, *best)) best = &item;
  }
  if (best == nullptr) return std::nullopt;
  return best->id;
}

}  // namespace

StatusOr<EvictionPolicy> parse_eviction_policy(std::string_view name) {
  if (name == "scheduler_aware") return EvictionPolicy::kSchedulerAware;
  if (name == "lru") return EvictionPolicy::kLru;
  if (name == "fifo") return EvictionPolicy::kFifo;
  return invalid_argument_error("unknown eviction policy '" + std::string(name) +
                                "' (scheduler_aware, lru, fifo)");
}

int64_t window_length(int64_t capacity_chunks, double mean_item_chunks, int64_t fallback) {
  if (capacity_chunks <= 0) return 0;
  if (mean_item_chunks <= 0) return fallback;
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(capacity_chunks / mean_item_chunks)));
}

std::vector<ItemId> prefetch_candidates(std::span<const ItemView> items,
                                        std::span<const ItemId> queue, int64_t window) {
  std::unordered_map<ItemId, const ItemView*> by_id;
  for (const ItemView& item : items) by_id.emplace(item.id, &item);
  std::vector<ItemId> out;
  const int64_t n = std::min<int64_t>(window, static_cast<int64_t>(queue.size()));
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(queue[i]);
    if (it == by_id.end()) continue;
    const ItemView& item = *it->second;
    if (item.needs_fetch && !item.pinned &&
        std::find(out.begin(), out.end(), item.id) == out.end()) {
      out.push_back(item.id);
    }
  }
  return out;
}

std::optional<ItemId> choose_top_victim(EvictionPolicy policy, std::span<const ItemView> items,
                                         std::span<const ItemId> queue, int64_t window) {
  auto in_dram = [](const ItemView& item) { return item.in_top && !item.pinned; };
  switch (policy) {
    case EvictionPolicy::kLru: return pick(items, in_dram, less_recently_used);
    case EvictionPolicy::kFifo: return pick(items, in_dram, stored_earlier);
    case EvictionPolicy::kSchedulerAware: break;
  }
  const int64_t n = std::min<int64_t>(window, static_cast<int64_t>(queue.size()));
  const std::span<const ItemId> in_window = queue.first(static_cast<size_t>(n));
  auto has_job_in_window = [&](ItemId id) {
    return std::find(in_window.begin(), in_window.end(), id) != in_window.end();
  };
  // First: DRAM items no job in the window will need.
  if (auto victim = pick(
          items, [&](const ItemView& item) { return in_dram(item) && !has_job_in_window(item.id); },
          less_recently_used)) {
    return victim;
  }
  // Every DRAM item has a job in the window: scan it tail -> head and demote the first found.
  std::unordered_map<ItemId, const ItemView*> by_id;
  for (const ItemView& item : items) by_id.emplace(item.id, &item);
  for (int64_t i = n - 1; i >= 0; --i) {
    auto it = by_id.find(in_window[i]);
    if (it != by_id.end() && in_dram(*it->second)) return it->first;
  }
  return std::nullopt;
}

std::optional<ItemId> choose_lower_victim(EvictionPolicy policy, std::span<const ItemView> items,
                                        std::span<const ItemId> queue, int64_t window,
                                        std::optional<ItemId> exclude) {
  auto in_lower = [&](const ItemView& item) {
    return item.in_lower && !item.pinned && item.id != exclude;
  };
  switch (policy) {
    case EvictionPolicy::kLru: return pick(items, in_lower, less_recently_used);
    case EvictionPolicy::kFifo: return pick(items, in_lower, stored_earlier);
    case EvictionPolicy::kSchedulerAware: break;
  }
  const std::unordered_map<ItemId, int64_t> first = first_positions(queue);
  auto position = [&](ItemId id) {
    auto it = first.find(id);
    return it == first.end() ? int64_t{-1} : it->second;
  };
  // Items without any queued job, least recently used first.
  if (auto victim = pick(items, [&](const ItemView& item) { return in_lower(item) && position(item.id) < 0; },
                         less_recently_used)) {
    return victim;
  }
  // Then the item whose job is farthest back, outside the window (inside it is exempt).
  return pick(
      items, [&](const ItemView& item) { return in_lower(item) && position(item.id) >= window; },
      [&](const ItemView& a, const ItemView& b) { return position(a.id) > position(b.id); });
}

int64_t read_buffer_layers(int64_t num_layers, double t_compute, double t_load) {
  if (num_layers <= 0) return 0;
  if (!(t_load > 0)) return 1;
  // (A hair below whole numbers rounds down: 40 - 39 / 1.56 is 15 in exact arithmetic.)
  const double k = std::ceil(static_cast<double>(num_layers) -
                             static_cast<double>(num_layers - 1) * t_compute / t_load - 1e-9);
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, num_layers);
}

}  // namespace strata::store
