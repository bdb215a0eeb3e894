// CachedAttention's read buffer (RestoreCoordinator, restore_coordinator.h): the first layers of
// the next waiting request's stored chunks copied to the device while the pass before it runs,
// sized from the measured load bandwidth and prefill time.

#include "coordinator_sequence.h"
#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/scheduler/scheduler.h"

namespace strata::restore {

void RestoreCoordinator::plan_preload(executor::ForwardBatch& forward) {
  // (Pre-loads are not sent to the other ranks: their loads read with their pass.)
  if (options_.store.read_buffer_layers == 0 || followers_ != nullptr) return;
  for (SeqId seq : scheduler_.waiting()) {
    Sequence& sequence = *sequences_.at(seq);
    if (!sequence.stored) continue;
    if (sequence.preloaded) return;  // the read buffer holds the next request already
    // A truncated prefix (chunks not consecutive) loads as usual.
    const std::vector<int64_t>& chunks = sequence.stored->chunks;
    if (chunks.back() - chunks.front() + 1 != std::ssize(chunks) || chunks.front() != 0) return;
    std::optional<store::StoreLease> lease = store_->try_acquire_in_dram(
        sequence.stored->item, 0, std::ssize(chunks), sequence.stored->skipped_chunks);
    if (!lease) return;  // still on SSD (a prefetch may bring it) or being moved
    const int64_t block = kv_.geometry().block_size_tokens;
    const int64_t new_tokens = std::ssize(kv_.tokens(seq)) - std::ssize(chunks) * block;
    const int64_t layers = preload_layers(std::ssize(chunks), new_tokens);
    forward.preloads.push_back({seq, lease->chunks, layers});
    sequence.preloaded = std::move(lease);
    ++stats_.preloads;
    stats_.preloaded_layers += layers;
    return;
  }
}

int64_t RestoreCoordinator::preload_layers(int64_t chunks, int64_t new_tokens) const {
  const int64_t num_layers = executor_.config().num_layers;
  if (options_.store.read_buffer_layers > 0) {
    return std::min<int64_t>(options_.store.read_buffer_layers, num_layers);
  }
  // Unmeasured yet: half the layers.
  if (load_bytes_per_second_ <= 0 || prefill_seconds_per_token_layer_ <= 0) {
    return std::max<int64_t>(1, num_layers / 2);
  }
  const double t_load = static_cast<double>(chunks * executor_.kv_chunk_bytes()) /
                        static_cast<double>(num_layers) / load_bytes_per_second_;
  const double t_compute =
      static_cast<double>(std::max<int64_t>(new_tokens, 1)) * prefill_seconds_per_token_layer_;
  return store::read_buffer_layers(num_layers, t_compute, t_load);
}

void RestoreCoordinator::release_preload(SeqId seq, Sequence& sequence) {
  if (!sequence.preloaded) return;
  store_->release(*sequence.preloaded, 0);
  sequence.preloaded.reset();
  executor_.drop_preload(seq);
}

}  // namespace strata::restore
