// The KV store under tensor parallelism (private to the executor; store/store_followers.h,
// docs/tensor-parallelism.md): rank 0's feed, which writes what its restore coordinator reports
// into the next message to the other ranks, and a rank > 0's store, which does the same on its
// own store and resolves each pass's loads and saves to its chunks.
//
// Events on the wire (plan_wire.h; string, hashes and tokens: u32 n, then n values), in the order
// rank 0's store saw them:
//   u8 kind, then
//   kBeginSave     u64 seq, string session, u8 exact, i64 token_offset, hashes chain,
//                  i64 skipped_chunks, i32 task, i64 whole_chunks
//   kExtendSave    u64 seq, i64 first_chunk, hashes
//   kEndSave       u64 seq, u8 store::SaveEnd
//   kEraseSession  string session
//   kLookUpShared  tokens prompt, hash root, string session
//   kSetQueue      u32 n, n x run
// A run of a load (store::StoredRun): string session, hash last_hash, i64 first_chunk, i64 count,
// i64 token_offset, i64 skipped_chunks, u8 exact. A held_by_all query: a run, hashes.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "plan_wire.h"
#include "strata/store/kv_store.h"
#include "tensor_shard.h"

namespace strata::executor {

void write_run(Writer& w, const store::StoredRun& run);
store::StoredRun read_run(Reader& r);
// A held_by_all query: the run, then its chunks' hashes.
void write_held_query(Writer& w, const store::StoredRun& run,
                      std::span<const kv::ChunkHash> hashes);
// What a rank reports of its store (StoreFollowers::rank_stats), as a row of kStatsRow values
// gathered from every rank, and back.
inline constexpr int64_t kStatsPerTier = 6;
inline constexpr int64_t kStatsRow = store::kMaxTiers * kStatsPerTier + 2;
std::vector<int64_t> stats_row(const store::StoreStats& stats);
store::StoreStats stats_of_row(std::span<const int64_t> row);

// Rank 0's side: what its restore coordinator reports, kept for the next message.
class FollowerFeed final : public store::StoreFollowers {
 public:
  // `ask` sends a held_by_all query (write_held_query's bytes) to the other ranks with the
  // events so far and returns the least any rank holds, `own` included (0 if the group fails).
  using Ask = std::function<int64_t(std::string query, int64_t own)>;
  FollowerFeed(const TensorShard& shard, Ask ask)
      : rank_(shard.rank),
        world_size_(shard.world_size),
        kv_heads_(shard.kv_heads.size()),
        max_kv_heads_(shard.max_kv_heads),
        ask_(std::move(ask)) {}

  void rank_options(store::StoreOptions* options) const override;
  void begin_save(SeqId seq, const store::SaveRequest& request) override;
  void extend_save(SeqId seq, int64_t first_chunk, std::span<const kv::ChunkHash> hashes) override;
  void end_save(SeqId seq, store::SaveEnd end) override;
  void load(SeqId seq, store::StoredRun run) override;
  void set_queue(std::vector<store::StoredRun> queue) override;
  int64_t held_by_all(const store::StoredRun& run, std::span<const kv::ChunkHash> hashes) override;
  std::vector<store::StoreStats> rank_stats() const override;
  // The rows ranks 1.. reported (stats_row), replacing the last ones.
  void set_rank_rows(std::span<const int64_t> rows);
  void erase_session(const std::string& session) override;
  void look_up_shared(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                      const std::string& session) override;

  // The events reported since the last call.
  std::string take_events();
  // The runs reported for `seq`'s load in the coming pass (empty if none).
  std::vector<store::StoredRun> take_runs(SeqId seq);
  void clear_runs() { runs_.clear(); }  // after the pass: none outlive it

 private:
  int32_t rank_, world_size_;
  int64_t kv_heads_, max_kv_heads_;  // this rank's, and the most any rank holds
  Ask ask_;
  mutable std::mutex mutex_;  // events_ (erase_session, look_up_shared: other threads), ranks_
  Writer events_;
  std::vector<store::StoreStats> ranks_;
  std::unordered_map<SeqId, std::vector<store::StoredRun>> runs_;  // step thread
};

// A rank > 0's store: rank 0's store's events done on its own, and the chunks of each pass.
// A save this store has less room for than rank 0's (or that began after a gap) is given back at
// its end rather than published with chunks never written.
class RankStore {
 public:
  explicit RankStore(std::unique_ptr<store::KvStore> store);
  ~RankStore();  // gives open saves back
  RankStore(const RankStore&) = delete;
  RankStore& operator=(const RankStore&) = delete;

  // INTERNAL for malformed events.
  Status apply(std::string_view events);
  // A held_by_all query's answer for this store (KvStore::held_prefix).
  int64_t held(Reader& query) const;
  store::StoreStats stats() const { return store_->stats(); }
  // A pass's load of `runs` (in block order): this store's chunks into `chunks`, pinned until
  // after_pass(); false (the chunks are zeros) when a run cannot be pinned here.
  bool load(std::span<const store::StoredRun> runs, std::vector<const std::byte*>* chunks);
  // Where a pass's save of blocks [first_block, first_block + chunks->size()) of `seq` goes:
  // its ticket's destinations, a scratch chunk for blocks it has none for.
  void save(SeqId seq, int64_t first_block, std::vector<std::byte*>* chunks);
  void after_pass();  // releases the pass's loads

 private:
  struct Saving {
    std::optional<store::SaveTicket> ticket;  // none: no room, or given back after a gap
    std::vector<bool> written;                // per destination
  };
  void begin(SeqId seq, const store::SaveRequest& request);
  void extend(SeqId seq, int64_t first_chunk, std::span<const kv::ChunkHash> hashes);
  void end(SeqId seq, store::SaveEnd how);

  std::unique_ptr<store::KvStore> store_;
  std::unordered_map<SeqId, Saving> saves_;
  std::vector<store::StoreLease> leases_;  // this pass's
  std::vector<std::byte> zeros_;           // a chunk: what a load that failed reads
  std::vector<std::byte> scratch_;         // a chunk: where saves without room write
};

}  // namespace strata::executor
