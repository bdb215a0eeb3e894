// Krul's loads beside the recompute (docs/krul.md): a restoring pass's stored history is read
// from the store on a thread of its own while the pass runs. The history's blocks are read in
// pieces in the order the pass's layers load them: layer l loads the blocks from its recompute
// boundary on, and boundaries never grow with depth, so the first piece is the first layer's
// blocks, the next one the blocks the second layer adds, and so on. The executor's loader thread
// waits for a block before the first layer that loads it (executor::ChunkArrivals). Private to the
// restore coordinator.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "strata/common/status.h"
#include "strata/executor/forward_batch.h"
#include "strata/store/kv_store.h"

namespace strata::restore {

class StreamedRead final : public executor::ChunkArrivals {
 public:
  // Will read chunks [first, first + count) of `item` as matched with `skipped_chunks`
  // (KvStore::acquire), piece by piece: `pieces` lists each piece's chunk count in reading order,
  // from the last chunk backwards (they sum to `count`). Chunk first + j is the load's chunk j.
  StreamedRead(store::KvStore& store, store::ItemId item, int64_t skipped_chunks, int64_t first,
               int64_t count, std::vector<int64_t> pieces);
  ~StreamedRead() override;  // joins the thread (the leases it took are released)
  // Starts the reads on a thread of their own (once).
  void start();
  StreamedRead(const StreamedRead&) = delete;
  StreamedRead& operator=(const StreamedRead&) = delete;

  // Thread-safe; blocks until chunk j is read (nullptr: its piece or an earlier one failed).
  const std::byte* wait(int64_t j) const override;

  // Waits for the last piece; hands over the leases taken (release them after the pass).
  struct Outcome {
    std::vector<store::StoreLease> leases;
    Status status;       // the first failure (the item was dropped), or OK
    double seconds = 0;  // spent acquiring the pieces that succeeded
    int64_t chunks = 0;  // those pieces' chunks
  };
  Outcome finish();

 private:
  void run();

  store::KvStore& store_;
  const store::ItemId item_;
  const int64_t skipped_chunks_;
  const int64_t first_;
  const std::vector<int64_t> pieces_;
  mutable std::mutex mutex_;
  mutable std::condition_variable arrived_;
  std::vector<const std::byte*> chunks_;  // null until read
  bool done_ = false;                     // no more chunks will arrive
  Outcome outcome_;
  std::thread thread_;
};

}  // namespace strata::restore
