// Krul's loads beside the recompute (docs/krul.md): a restoring pass's stored history is read
// from the store on a thread of its own while the pass runs, layer by layer. Layer l loads the
// history's blocks from its recompute boundary on, and boundaries never grow with depth; the
// thread reads layer 0's part of the chunks it loads, then layer 1's part of those it loads, and
// so on (KvStore::read_layers: an SSD tier reads just those bytes), a few layers at a time. The
// executor's loader thread waits for a chunk's layer before copying it into that layer
// (executor::ChunkArrivals). Chunks of Krul's layer merge are read in their merged form, a pair's
// layers together (its data lies at its deep layer's place), and restored to raw layers on the
// same thread as they arrive, so their restoration also runs beside the pass. Private to the
// restore coordinator.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "strata/common/status.h"
#include "strata/executor/forward_batch.h"
#include "strata/store/kv_store.h"

namespace strata::restore {

class StreamedRead final : public executor::ChunkArrivals {
 public:
  // Restores layers [begin, end) of raw chunks out[i] from merged chunks in[i]
  // (Executor::unmerge_kv_chunks with the lease's pairs).
  using Unmerge =
      std::function<Status(std::span<const std::byte* const> in, std::span<std::byte* const> out,
                           int32_t begin, int32_t end)>;

  // Will read the chunks of `lease` that are not whole (KvStore::pin_layers; chunk j of the
  // lease is the load's chunk j): layer l's part of chunks [layer_first[l], count), where
  // layer_first (one per layer) does not increase with depth. A merged lease (layer pairs) needs
  // `unmerge`; its chunks are handed over restored, whole ones in DRAM too.
  StreamedRead(store::KvStore& store, store::LayeredLease lease, std::vector<int64_t> layer_first,
               Unmerge unmerge = nullptr);
  ~StreamedRead() override;  // joins the thread and releases the lease
  // Starts the reads on a thread of their own (once).
  void start();
  StreamedRead(const StreamedRead&) = delete;
  StreamedRead& operator=(const StreamedRead&) = delete;

  // Thread-safe; blocks until layer `layer` of chunk j is read: the chunk (every layer's bytes at
  // their place; those not read yet undefined), or nullptr when a read failed.
  const std::byte* wait(int64_t j, int64_t layer) const override;

  // Waits for the reads; hands over the lease (release it after the pass).
  struct Outcome {
    store::StoreLease lease;
    Status status;  // the first failure (a read's: the item was dropped; or a restoring's), or OK
    double seconds = 0;  // spent reading the parts that succeeded
    double chunks = 0;   // their bytes, in raw chunks (every layer of one block)
    // A merged lease's restoring: seconds spent, and the (chunk, layer)s restored.
    double restore_seconds = 0;
    int64_t restored_layers = 0;
  };
  Outcome finish();

 private:
  void run();
  // Layers [begin, end) of a merged lease read: restores them in every chunk loading any of them;
  // the (chunk, layer)s restored.
  StatusOr<int64_t> restore(int64_t begin, int64_t end);
  bool merged() const { return !lease_.lease.layer_pairs.empty(); }

  store::KvStore& store_;
  store::LayeredLease lease_;
  const std::vector<int64_t> layer_first_;
  const Unmerge unmerge_;
  std::vector<std::vector<std::byte>> restored_;  // a merged lease's chunks, raw
  mutable std::mutex mutex_;
  mutable std::condition_variable arrived_;
  int64_t layers_read_ = 0;  // layers [0, layers_read_) of every chunk they load are read
  bool failed_ = false;
  bool released_ = false;  // the lease was handed over by finish()
  Outcome outcome_;
  std::thread thread_;
};

}  // namespace strata::restore
