// Krul in the restore coordinator (docs/krul.md): the restoration of a resumed turn
// (restoration_plan, plan_restorations: each layer recomputes a prefix of the stored history,
// never longer than the layer above's, and loads the rest, in the same pass as the new turn), and
// the conversation's layer pairs (choose_layer_pairs: chosen at each turn's end; unmerge_load:
// chunks the layer-merge codec stored, restored for their load).

#include <algorithm>
#include <numeric>

#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/kv/krul_policy.h"
#include "strata/restore/restore_coordinator.h"

namespace strata::restore {

std::vector<int64_t> RestoreCoordinator::restoration_plan(int64_t history, int64_t room,
                                                          store::TierIndex from,
                                                          int64_t other_tokens) const {
  const int64_t block = kv_.geometry().block_size_tokens;
  const auto layers = static_cast<int32_t>(executor_.config().num_layers);
  kv::krul::RestorePlan plan;
  switch (options_.store.restore_mode) {
    case store::RestoreMode::kLoad:
      return {};
    case store::RestoreMode::kPartial:
      plan = kv::krul::fixed_ratio_plan(history, layers, options_.store.recompute_ratio, block);
      break;
    case store::RestoreMode::kKrul: {
      // Costs per token and layer on this machine: the prefill's, and a stored chunk's pin and
      // read from tier `from` and copy into the pool. Unmeasured: load everything (which
      // measures them).
      const double pin = pin_seconds_per_chunk_[from];
      if (prefill_seconds_per_token_layer_ <= 0 || load_bytes_per_second_ <= 0 || pin <= 0) {
        return {};
      }
      const double chunk_layer_bytes =
          static_cast<double>(executor_.kv_chunk_bytes()) / static_cast<double>(layers);
      kv::krul::RestoreCosts costs;
      costs.compute_per_token = prefill_seconds_per_token_layer_;
      costs.load_per_token =
          (pin / layers + chunk_layer_bytes / load_bytes_per_second_) / static_cast<double>(block);
      costs.other_compute =
          static_cast<double>(other_tokens * layers) * prefill_seconds_per_token_layer_;
      costs.merged_load_per_token = costs.load_per_token;
      plan = kv::krul::plan_restore(history, layers, {}, costs, block);
      break;
    }
  }
  // Within the step's room, in whole blocks (a minimum keeps the pyramid).
  const int64_t cap = std::max<int64_t>(room, 0) / block * block;
  for (int64_t& rows : plan.boundary) rows = std::min(rows, cap);
  // A plan that recomputes nothing is a plain load, unless Krul's loads from a lower tier can run
  // beside the pass's other rows (decision 10).
  const bool streams = options_.store.restore_mode == store::RestoreMode::kKrul &&
                       from > store::kDramTier && executor_.streams_loads();
  if (plan.boundary.empty() || (plan.boundary.front() == 0 && !streams)) return {};
  return plan.boundary;
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
  STRATA_RETURN_IF_ERROR(executor_.unmerge_kv_chunks(merged_form_, lease.layer_pairs, chunks, out));
  std::copy(out.begin(), out.end(), chunks.begin());
  stats_.merged_chunks_loaded += std::ssize(chunks);
  return Status();
}

}  // namespace strata::restore
