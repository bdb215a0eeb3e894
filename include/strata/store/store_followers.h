// Tensor parallelism with the KV store (docs/tensor-parallelism.md): every rank keeps a KvStore of
// its own KV heads, holding the same items. Rank 0's restore coordinator runs the scheduler's
// decisions on its store and reports each one here; the executor carries them to the other ranks
// with its next message, and each rank does the same on its store. Ranks number items their own
// way, so saves are named by sequence and loads by content (StoredRun).
//
// A rank's store may hold less than rank 0's (its I/O threads move items on their own timing, its
// disk may have lost a file): a save that rank has no room for leaves its item shorter. So a
// lookup's match is cut to what every rank holds (held_by_all), and a load some rank still cannot
// pin fails on every rank (executor::ForwardResult::failed_loads): its sequence recomputes and no
// pass mixes KV of different conversations.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/common/ids.h"
#include "strata/kv/kv_types.h"

namespace strata::store {

struct SaveRequest;
struct StoreOptions;
struct StoreStats;

// Chunks [first_chunk, first_chunk + count) of a stored item, named so that another rank's store
// finds its own copy: the item's session key (empty: found by content), the hash of its last
// chunk (chained over every token before it), and the item's shape as StoreMatch reports it.
struct StoredRun {
  std::string session;
  kv::ChunkHash last_hash;
  int64_t first_chunk = 0;
  int64_t count = 0;
  int64_t token_offset = 0;
  int64_t skipped_chunks = 0;
  bool exact = true;
};

// How a save ended (KvStore::commit_save, continue_save, abort_save).
enum class SaveEnd : uint8_t { kCommit = 1, kContinue = 2, kAbort = 3 };

class StoreFollowers {
 public:
  virtual ~StoreFollowers() = default;
  // Makes `options` (a deployment's store, chunk layout set) those of rank 0's store: its own
  // heads' chunks, directories and layout tag (make_rank_options).
  virtual void rank_options(StoreOptions* options) const = 0;

  // Step thread, in the order rank 0's store saw them. A sequence's save began with `request`
  // (rank 0 got a ticket), grew by `hashes` from chunk `first_chunk` on (extend_save: the chunks
  // rank 0 got room for), or ended.
  virtual void begin_save(SeqId seq, const SaveRequest& request) = 0;
  virtual void extend_save(SeqId seq, int64_t first_chunk,
                           std::span<const kv::ChunkHash> hashes) = 0;
  virtual void end_save(SeqId seq, SaveEnd end) = 0;
  // The next pass's load of `seq` reads `run` (one call per run of consecutive chunks, in block
  // order; the runs of a load rank 0 could not pin are not reported).
  virtual void load(SeqId seq, StoredRun run) = 0;
  // KvStore::set_queue: the stored prefixes the waiting requests will load, head first.
  virtual void set_queue(std::vector<StoredRun> queue) = 0;
  // Of the leading chunks of a stored item (`run` from chunk 0, `hashes` its chunks' hashes),
  // how many every other rank's store holds now (asked of them and waited for: a lookup's match
  // is cut to it, so a rank that has not finished writing or reading a conversation loads less
  // instead of failing the load on every rank). 0 when the group fails.
  virtual int64_t held_by_all(const StoredRun& run, std::span<const kv::ChunkHash> hashes) = 0;
  // Any thread: ranks 1.. N-1's stores as they last reported them (every few seconds): per tier
  // (unnamed, in the order of rank 0's) its chunks, used and capacity bytes, hits, misses and
  // whether it is available; the items and corrupt chunks. Empty before the first report.
  virtual std::vector<StoreStats> rank_stats() const = 0;

  // Any thread: KvStore::erase_session and look_up_shared on every rank.
  virtual void erase_session(const std::string& session) = 0;
  virtual void look_up_shared(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                              const std::string& session) = 0;
};

// The options of rank `rank`'s store in a group of `world_size` whose chunks hold `kv_heads` of
// the most any rank holds (`max_kv_heads`): directories and a layout tag of its own (a conversation
// resumes at the tensor-parallel size it was saved at; the shared tier keys items per rank), and
// byte budgets scaled by kv_heads / max_kv_heads, so every rank's store has room for as many
// chunks.
void make_rank_options(StoreOptions* options, int32_t rank, int32_t world_size, int64_t kv_heads,
                       int64_t max_kv_heads);

}  // namespace strata::store
