// The KV store under tensor parallelism: rank 0's feed and the other ranks' stores
// (tensor_parallel_store.h).

#include "tensor_parallel_store.h"

#include <algorithm>
#include <utility>

namespace strata::executor {
namespace {

enum class Event : uint8_t {
  kBeginSave = 1,
  kExtendSave = 2,
  kEndSave = 3,
  kEraseSession = 4,
  kLookUpShared = 5,
  kSetQueue = 6,
};

}  // namespace

void write_run(Writer& w, const store::StoredRun& run) {
  w.string(run.session);
  w.put(run.last_hash);
  w.put(run.first_chunk);
  w.put(run.count);
  w.put(run.token_offset);
  w.put(run.skipped_chunks);
  w.put(static_cast<uint8_t>(run.exact));
}

store::StoredRun read_run(Reader& r) {
  store::StoredRun run;
  run.session = r.string();
  run.last_hash = r.get<kv::ChunkHash>();
  run.first_chunk = r.get<int64_t>();
  run.count = r.get<int64_t>();
  run.token_offset = r.get<int64_t>();
  run.skipped_chunks = r.get<int64_t>();
  run.exact = r.get<uint8_t>() != 0;
  return run;
}

void write_held_query(Writer& w, const store::StoredRun& run,
                      std::span<const kv::ChunkHash> hashes) {
  write_run(w, run);
  w.span(hashes);
}

int64_t FollowerFeed::held_by_all(const store::StoredRun& run,
                                  std::span<const kv::ChunkHash> hashes) {
  Writer query;
  write_held_query(query, run, hashes);
  return ask_(query.take(), std::ssize(hashes));
}

std::vector<int64_t> stats_row(const store::StoreStats& stats) {
  std::vector<int64_t> row(kStatsRow, 0);
  for (size_t t = 0; t < std::min<size_t>(stats.tiers.size(), store::kMaxTiers); ++t) {
    const store::TierStats& tier = stats.tiers[t];
    int64_t* out = row.data() + t * kStatsPerTier;
    out[0] = tier.available ? 2 : 1;  // 0: no such tier
    out[1] = tier.chunks;
    out[2] = tier.used_bytes;
    out[3] = tier.capacity_bytes;
    out[4] = tier.hits;
    out[5] = tier.misses;
  }
  row[kStatsRow - 2] = stats.items;
  row[kStatsRow - 1] = stats.corrupt_chunks;
  return row;
}

store::StoreStats stats_of_row(std::span<const int64_t> row) {
  store::StoreStats stats;
  for (int64_t t = 0; t < store::kMaxTiers && row[t * kStatsPerTier] > 0; ++t) {
    const int64_t* in = row.data() + t * kStatsPerTier;
    store::TierStats& tier = stats.tiers.emplace_back();
    tier.available = in[0] == 2;
    tier.chunks = in[1];
    tier.used_bytes = in[2];
    tier.capacity_bytes = in[3];
    tier.hits = in[4];
    tier.misses = in[5];
  }
  stats.items = row[kStatsRow - 2];
  stats.corrupt_chunks = row[kStatsRow - 1];
  return stats;
}

std::vector<store::StoreStats> FollowerFeed::rank_stats() const {
  std::scoped_lock lock(mutex_);
  return ranks_;
}

void FollowerFeed::set_rank_rows(std::span<const int64_t> rows) {
  std::vector<store::StoreStats> ranks;
  for (size_t at = 0; at + kStatsRow <= rows.size(); at += kStatsRow) {
    ranks.push_back(stats_of_row(rows.subspan(at, kStatsRow)));
  }
  std::scoped_lock lock(mutex_);
  ranks_ = std::move(ranks);
}

void FollowerFeed::rank_options(store::StoreOptions* options) const {
  store::make_rank_options(options, rank_, world_size_, kv_heads_, max_kv_heads_);
}

void FollowerFeed::begin_save(SeqId seq, const store::SaveRequest& request) {
  std::scoped_lock lock(mutex_);
  events_.put(Event::kBeginSave);
  events_.put(seq.value);
  events_.string(request.session);
  events_.put(static_cast<uint8_t>(request.exact));
  events_.put(request.token_offset);
  events_.span(std::span<const kv::ChunkHash>(request.chain));
  events_.put(request.skipped_chunks);
  events_.put(request.task);
  events_.put(request.whole_chunks);
}

void FollowerFeed::extend_save(SeqId seq, int64_t first_chunk,
                               std::span<const kv::ChunkHash> hashes) {
  std::scoped_lock lock(mutex_);
  events_.put(Event::kExtendSave);
  events_.put(seq.value);
  events_.put(first_chunk);
  events_.span(hashes);
}

void FollowerFeed::end_save(SeqId seq, store::SaveEnd end) {
  std::scoped_lock lock(mutex_);
  events_.put(Event::kEndSave);
  events_.put(seq.value);
  events_.put(end);
}

void FollowerFeed::load(SeqId seq, store::StoredRun run) { runs_[seq].push_back(std::move(run)); }

void FollowerFeed::set_queue(std::vector<store::StoredRun> queue) {
  std::scoped_lock lock(mutex_);
  events_.put(Event::kSetQueue);
  events_.put(static_cast<uint32_t>(queue.size()));
  for (const store::StoredRun& run : queue) write_run(events_, run);
}

void FollowerFeed::erase_session(const std::string& session) {
  std::scoped_lock lock(mutex_);
  events_.put(Event::kEraseSession);
  events_.string(session);
}

void FollowerFeed::look_up_shared(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                  const std::string& session) {
  std::scoped_lock lock(mutex_);
  events_.put(Event::kLookUpShared);
  events_.span(prompt);
  events_.put(root);
  events_.string(session);
}

std::string FollowerFeed::take_events() {
  std::scoped_lock lock(mutex_);
  return events_.take();
}

std::vector<store::StoredRun> FollowerFeed::take_runs(SeqId seq) {
  auto it = runs_.find(seq);
  if (it == runs_.end()) return {};
  std::vector<store::StoredRun> runs = std::move(it->second);
  runs_.erase(it);
  return runs;
}

RankStore::RankStore(std::unique_ptr<store::KvStore> store)
    : store_(std::move(store)),
      zeros_(static_cast<size_t>(store_->options().chunk_bytes)),
      scratch_(static_cast<size_t>(store_->options().chunk_bytes)) {}

RankStore::~RankStore() {
  after_pass();
  for (auto& [seq, saving] : saves_) {
    if (saving.ticket) store_->abort_save(*saving.ticket);
  }
}

Status RankStore::apply(std::string_view events) {
  Reader r(events);
  while (!r.done()) {
    const auto event = r.get<Event>();
    switch (event) {
      case Event::kBeginSave: {
        const SeqId seq{r.get<uint64_t>()};
        store::SaveRequest request;
        request.session = r.string();
        request.exact = r.get<uint8_t>() != 0;
        request.token_offset = r.get<int64_t>();
        request.chain = r.vector<kv::ChunkHash>();
        request.skipped_chunks = r.get<int64_t>();
        request.task = r.get<int32_t>();
        request.whole_chunks = r.get<int64_t>();
        if (r.good()) begin(seq, request);
        break;
      }
      case Event::kExtendSave: {
        const SeqId seq{r.get<uint64_t>()};
        const auto first_chunk = r.get<int64_t>();
        const std::vector<kv::ChunkHash> hashes = r.vector<kv::ChunkHash>();
        if (r.good()) extend(seq, first_chunk, hashes);
        break;
      }
      case Event::kEndSave: {
        const SeqId seq{r.get<uint64_t>()};
        const auto how = r.get<store::SaveEnd>();
        if (r.good()) end(seq, how);
        break;
      }
      case Event::kEraseSession: {
        const std::string session = r.string();
        if (r.good()) store_->erase_session(session);
        break;
      }
      case Event::kLookUpShared: {
        const std::vector<TokenId> prompt = r.vector<TokenId>();
        const auto root = r.get<kv::ChunkHash>();
        const std::string session = r.string();
        if (r.good()) store_->look_up_shared(prompt, root, session);
        break;
      }
      case Event::kSetQueue: {
        std::vector<store::ItemId> queue;
        for (uint32_t n = r.get<uint32_t>(); n > 0 && r.good(); --n) {
          // (A waiting request whose prefix this store lacks: its load will fail on every rank.)
          if (std::optional<store::ItemId> item = store_->find_run(read_run(r))) {
            queue.push_back(*item);
          }
        }
        if (r.good()) store_->set_queue(std::move(queue));
        break;
      }
      default:
        return internal_error("tensor parallelism: an unknown KV store event");
    }
  }
  if (!r.ok()) return internal_error("tensor parallelism: malformed KV store events");
  return Status();
}

int64_t RankStore::held(Reader& query) const {
  const store::StoredRun run = read_run(query);
  const std::vector<kv::ChunkHash> hashes = query.vector<kv::ChunkHash>();
  return query.ok() ? store_->held_prefix(run, hashes) : 0;
}

void RankStore::begin(SeqId seq, const store::SaveRequest& request) {
  Saving& saving = saves_[seq];
  if (saving.ticket) store_->abort_save(*saving.ticket);  // (rank 0 began it again)
  saving = {};
  StatusOr<store::SaveTicket> ticket = store_->begin_save(request);
  if (!ticket.ok()) return;  // no room here: this rank's item misses this turn's chunks
  saving.written.assign(ticket->destinations.size(), false);
  saving.ticket = *std::move(ticket);
}

void RankStore::extend(SeqId seq, int64_t first_chunk, std::span<const kv::ChunkHash> hashes) {
  auto it = saves_.find(seq);
  if (it == saves_.end() || !it->second.ticket) return;
  Saving& saving = it->second;
  store::SaveTicket& ticket = *saving.ticket;
  const int64_t end = ticket.first_chunk + std::ssize(ticket.destinations);
  if (end < first_chunk) {
    // A gap (this store had less room than rank 0's): the chunks in it are never written.
    store_->abort_save(ticket);
    saving.ticket.reset();
    return;
  }
  const int64_t have = end - first_chunk;
  if (have >= std::ssize(hashes)) return;
  store_->extend_save(&ticket, hashes.subspan(static_cast<size_t>(have)));
  saving.written.resize(ticket.destinations.size(), false);
}

void RankStore::end(SeqId seq, store::SaveEnd how) {
  auto it = saves_.find(seq);
  if (it == saves_.end()) return;
  Saving& saving = it->second;
  const bool whole = saving.ticket && std::ranges::all_of(saving.written, [](bool w) { return w; });
  if (saving.ticket && (how == store::SaveEnd::kAbort || !whole)) {
    store_->abort_save(*saving.ticket);
    saving.ticket.reset();
  }
  if (how == store::SaveEnd::kContinue && saving.ticket) {
    saving.ticket = store_->continue_save(*std::move(saving.ticket), nullptr, 0);
    saving.written.clear();
    return;
  }
  if (how == store::SaveEnd::kCommit && saving.ticket) {
    store_->commit_save(*std::move(saving.ticket), nullptr, 0);
  }
  if (how != store::SaveEnd::kContinue) saves_.erase(it);
}

bool RankStore::load(std::span<const store::StoredRun> runs,
                     std::vector<const std::byte*>* chunks) {
  const size_t held = leases_.size();
  for (const store::StoredRun& run : runs) {
    StatusOr<store::StoreLease> lease = store_->acquire_run(run);
    if (!lease.ok()) {  // (rank 0 counts the failed load)
      for (size_t i = held; i < leases_.size(); ++i) store_->release(leases_[i], 0);
      leases_.erase(leases_.begin() + static_cast<std::ptrdiff_t>(held), leases_.end());
      int64_t count = 0;
      for (const store::StoredRun& r : runs) count += r.count;
      chunks->assign(static_cast<size_t>(count), zeros_.data());
      return false;
    }
    chunks->insert(chunks->end(), lease->chunks.begin(), lease->chunks.end());
    leases_.push_back(*std::move(lease));
  }
  return true;
}

void RankStore::save(SeqId seq, int64_t first_block, std::vector<std::byte*>* chunks) {
  auto it = saves_.find(seq);
  for (int64_t i = 0; i < std::ssize(*chunks); ++i) {
    (*chunks)[i] = scratch_.data();
    if (it == saves_.end() || !it->second.ticket) continue;
    const store::SaveTicket& ticket = *it->second.ticket;
    const int64_t d = first_block + i - ticket.first_chunk;
    if (d < 0 || d >= std::ssize(ticket.destinations)) continue;
    (*chunks)[i] = ticket.destinations[d];
    it->second.written[d] = true;
  }
}

void RankStore::after_pass() {
  for (const store::StoreLease& lease : leases_) store_->release(lease, 0);
  leases_.clear();
}

}  // namespace strata::executor
