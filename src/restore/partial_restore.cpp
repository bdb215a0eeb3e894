// Krul in the restore coordinator (docs/krul.md): the restoration of a resumed turn
// (restoration_plan, plan_restorations: each layer recomputes a prefix of the stored history,
// never longer than the layer above's, and loads the rest, in the same pass as the new turn), the
// stored suffix (store_suffix at each turn's end, recompute_floor at the next), and the
// conversation's layer pairs (choose_layer_pairs: chosen at each turn's end; unmerge_load:
// chunks the layer-merge codec stored, restored for their load).

#include <algorithm>
#include <numeric>

#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/kv/krul_policy.h"
#include "strata/restore/restore_coordinator.h"

namespace strata::restore {

std::vector<int64_t> RestoreCoordinator::restoration_plan(
    int64_t history, int64_t room, store::TierIndex from, int64_t other_tokens,
    std::span<const int64_t> floor, const std::vector<kv::krul::LayerPair>& pairs) const {
  const int64_t block = kv_.geometry().block_size_tokens;
  const auto layers = static_cast<int32_t>(executor_.config().num_layers);
  kv::krul::RestorePlan plan;
  switch (options_.store.restore_mode) {
    case store::RestoreMode::kLoad:
      plan.boundary.assign(floor.begin(), floor.end());
      break;
    case store::RestoreMode::kPartial:
      plan = kv::krul::fixed_ratio_plan(history, layers, options_.store.recompute_ratio, block);
      break;
    case store::RestoreMode::kKrul: {
      // Costs per token and layer on this machine: the prefill's, and a stored chunk's pin and
      // read from tier `from` and copy into the pool. Unmeasured: load everything (which
      // measures them).
      const double pin = pin_seconds_per_chunk_[from];
      if (prefill_seconds_per_token_layer_ <= 0 || load_bytes_per_second_ <= 0 || pin <= 0) {
        plan.boundary.assign(floor.begin(), floor.end());
        break;
      }
      const double chunk_layer_bytes =
          static_cast<double>(executor_.kv_chunk_bytes()) / static_cast<double>(layers);
      kv::krul::RestoreCosts costs;
      costs.compute_per_token = prefill_seconds_per_token_layer_;
      costs.load_per_token =
          (pin / layers + chunk_layer_bytes / load_bytes_per_second_) / static_cast<double>(block);
      costs.other_compute =
          static_cast<double>(other_tokens * layers) * prefill_seconds_per_token_layer_;
      // A merged pair reads one layer's place and its side data (magnitudes, retained vectors)
      // in that share of a chunk's read time, restores both layers (measured beside earlier
      // passes; 0 before) and copies them into the pool; a merged history's other layers are
      // restored (copied out of the merged form) too.
      costs.merged_load_per_token = costs.load_per_token;
      if (!pairs.empty()) {
        const double side_bytes =
            (static_cast<double>(executor_.kv_chunk_bytes(merged_form_)) -
             static_cast<double>(layers - merged_form_.pairs) * chunk_layer_bytes) /
            merged_form_.pairs;
        const double restore = restore_seconds_per_layer_;
        costs.merged_load_per_token = (pin / layers * (1 + side_bytes / chunk_layer_bytes) +
                                       2 * (restore + chunk_layer_bytes / load_bytes_per_second_)) /
                                      static_cast<double>(block);
        costs.load_per_token += restore / static_cast<double>(block);
      }
      plan = kv::krul::plan_restore(history, layers, pairs, costs, block, floor);
      break;
    }
  }
  // Within the step's room, in whole blocks (a minimum keeps the pyramid), but never below the
  // floor of a stored suffix (a maximum of two non-increasing sequences is one).
  const int64_t cap = std::max<int64_t>(room, 0) / block * block;
  for (size_t l = 0; l < plan.boundary.size(); ++l) {
    plan.boundary[l] = std::min(plan.boundary[l], cap);
    if (!floor.empty()) plan.boundary[l] = std::max(plan.boundary[l], std::min(floor[l], history));
  }
  // A plan that recomputes nothing is a plain load, unless Krul's loads from a lower tier can run
  // beside the pass's other rows (decision 10).
  const bool streams = options_.store.restore_mode == store::RestoreMode::kKrul &&
                       from > store::kDramTier && executor_.streams_loads();
  if (plan.boundary.empty() || (plan.boundary.front() == 0 && !streams)) return {};
  return plan.boundary;
}

std::vector<int64_t> RestoreCoordinator::recompute_floor(
    std::span<const int32_t> first_layers) const {
  if (first_layers.empty()) return {};
  const int64_t block = kv_.geometry().block_size_tokens;
  std::vector<int64_t> floor(static_cast<size_t>(executor_.config().num_layers), 0);
  for (int64_t j = std::ssize(first_layers); j-- > 0;) {
    // Layers [0, first_layers[j]) recompute block j, and so every block before it.
    for (int32_t l = 0; l < first_layers[j]; ++l) {
      floor[l] = std::max(floor[l], (j + 1) * block);
    }
  }
  return floor;
}

void RestoreCoordinator::store_suffix(store::ItemId item, int64_t chunks, bool turn_end,
                                      const std::vector<kv::krul::LayerPair>& pairs) {
  const int64_t block = kv_.geometry().block_size_tokens;
  // Idle conversations move to the nearest tier below DRAM: the plan costs reads from there.
  const store::TierIndex tier = store_->num_tiers() > 1 ? 1 : store::kDramTier;
  const std::vector<int64_t> rows =
      restoration_plan(chunks * block, options_.max_batched_tokens / 2, tier, 0, {}, pairs);
  // Chunk k is loaded by the layers whose boundary lies at or before it; one recomputed by every
  // layer still keeps its last (the store keeps at least one layer of a chunk).
  const auto last_layer = static_cast<int32_t>(executor_.config().num_layers - 1);
  std::vector<int32_t> first_layers(static_cast<size_t>(chunks), 0);
  int64_t dropped = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    const auto loaders_after = static_cast<int32_t>(
        std::ranges::count_if(rows, [&](int64_t boundary) { return boundary > k * block; }));
    first_layers[k] = std::min(loaders_after, last_layer);
    dropped += first_layers[k];
  }
  store_->set_stored_layers(item, std::move(first_layers));
  if (dropped == 0 || !turn_end) return;
  ++stats_.suffix_turns;
  stats_.suffix_dropped_chunk_layers += dropped;
}

void RestoreCoordinator::plan_restorations(executor::ForwardBatch& forward) {
  if (restorations_.empty()) return;
  for (executor::SequenceChunk& chunk : forward.chunks) {
    auto it = restorations_.find(chunk.seq);
    if (it == restorations_.end()) continue;
    // The chunk started after the stored history; it now starts at 0 with the history first.
    const std::vector<TokenId>& tokens = kv_.tokens(chunk.seq);
    const int64_t history = chunk.start_position;
    std::vector<TokenId> all(tokens.begin(), tokens.begin() + history);
    all.insert(all.end(), chunk.tokens.begin(), chunk.tokens.end());
    chunk.tokens = std::move(all);
    chunk.start_position = 0;
    chunk.restored_tokens = history;
    chunk.computed_rows = std::move(it->second);
    count_restoration(chunk, 1);
  }
  restorations_.clear();
}

void RestoreCoordinator::count_restoration(const executor::SequenceChunk& chunk, int64_t sign) {
  const int64_t layers = executor_.config().num_layers;
  stats_.partial_restores += sign;
  stats_.restore_history_token_layers += sign * chunk.restored_tokens * layers;
  stats_.restore_recomputed_token_layers +=
      sign * std::accumulate(chunk.computed_rows.begin(), chunk.computed_rows.end(), int64_t{0});
}

std::vector<kv::krul::LayerPair> RestoreCoordinator::choose_layer_pairs(
    const std::optional<kv::krul::AttentionStats>& stats) {
  const auto layers = static_cast<int32_t>(executor_.config().num_layers);
  std::vector<kv::krul::LayerPair> pairs;
  switch (options_.store.layer_pairing) {
    case store::LayerPairing::kNone:
      return {};
    case store::LayerPairing::kMiniCache:
      // MiniCache merges from the middle of the model to its end: the deepest layers.
      pairs = kv::krul::adjacent_pairs(layers - 2 * merged_form_.pairs, layers - 1);
      break;
    case store::LayerPairing::kKrul: {
      if (!stats) return {};
      pairs = kv::krul::select_pairs(
          *stats, kv::krul::initial_recent_layers(*stats, options_.store.krul_gamma),
          options_.store.layer_share);
      break;
    }
  }
  ++stats_.pair_maps;
  // Fewer I-R layers than the share asks for: the conversation is stored unmerged.
  if (std::ssize(pairs) != merged_form_.pairs) return {};
  stats_.paired_layers += 2 * std::ssize(pairs);
  return pairs;
}

Status RestoreCoordinator::unmerge_load(const store::StoreLease& lease,
                                        std::span<const std::byte*> chunks) {
  const auto raw = static_cast<size_t>(executor_.kv_chunk_bytes());
  std::vector<std::byte*> out;
  for (size_t i = 0; i < chunks.size(); ++i) {
    out.push_back(unmerged_chunks_.emplace_back(raw).data());
  }
  STRATA_RETURN_IF_ERROR(
      executor_.unmerge_kv_chunks(merged_form_, lease.layer_pairs, chunks, out, 0,
                                  static_cast<int32_t>(executor_.config().num_layers)));
  std::copy(out.begin(), out.end(), chunks.begin());
  stats_.merged_chunks_loaded += std::ssize(chunks);
  return Status();
}

}  // namespace strata::restore
