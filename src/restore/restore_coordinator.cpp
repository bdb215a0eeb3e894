#include "strata/restore/restore_coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <utility>

#include "coordinator_sequence.h"
#include "item_codecs.h"
#include "strata/common/check.h"
#include "strata/common/clock.h"
#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/kv/prefix_hash.h"
#include "streamed_read.h"
#include "xxhash.h"

namespace strata::restore {
namespace {

// The name a session's KV goes by in the store, which persists it on disk: a digest, so the
// journal holds no API key or client-chosen id.
std::string store_session_key(const std::string& session) {
  if (session.empty()) return {};
  const XXH128_hash_t h = XXH3_128bits(session.data(), session.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

// Whether chunks of a load from block `first_block` on, keeping layers from first_layers[i] on
// (store::StoreLease::first_layers; empty: all), hold every layer that loads them: block b is
// loaded by the layers whose recompute boundary in `rows` lies at or before it (all when `rows`
// is empty).
bool reads_stored_layers(std::span<const int32_t> first_layers, int64_t first_block,
                         std::span<const int64_t> rows, int64_t block) {
  for (int64_t i = 0; i < std::ssize(first_layers); ++i) {
    const int64_t start = (first_block + i) * block;
    const auto first_loader =
        std::ranges::count_if(rows, [&](int64_t boundary) { return boundary > start; });
    if (first_layers[i] > first_loader) return false;
  }
  return true;
}

// Exponential moving average, 0 until the first sample.
void update_average(double& average, double sample) {
  constexpr double kWeight = 0.2;  // of the newest sample
  average = average > 0 ? (1 - kWeight) * average + kWeight * sample : sample;
}

}  // namespace

StatusOr<std::unique_ptr<RestoreCoordinator>> RestoreCoordinator::open(
    const RestoreOptions& options, executor::Executor& executor, kv::KvCacheManager& kv,
    scheduler::Scheduler& scheduler, uint64_t model_fingerprint) {
  std::unique_ptr<RestoreCoordinator> c(
      new RestoreCoordinator(options, executor, kv, scheduler, model_fingerprint));
  store::StoreOptions store = store::StoreOptions::from_config(options.store);
  store.chunk_bytes = executor.kv_chunk_bytes();
  store.block_size_tokens = executor.kv_geometry().block_size_tokens;
  store.chunk_layers = executor.config().num_layers;
  store.layout_tag = store::layout_tag(model_fingerprint, executor.kv_format(),
                                       store.block_size_tokens, store.chunk_bytes);
  if (c->followers_ != nullptr) c->followers_->rank_options(&store);
  const executor::Executor* e = &executor;
  store.register_host_memory = [e](void* data, size_t bytes) { e->register_host_memory(data, bytes); };
  store.unregister_host_memory = [e](void* data) { e->unregister_host_memory(data); };
  STRATA_ASSIGN_OR_RETURN(
      c->codec_formats_, configure_item_codecs(options.store, executor, model_fingerprint, &store));
  c->merged_form_ = merged_form(options.store, executor);
  STRATA_ASSIGN_OR_RETURN(c->store_, store::KvStore::open(store));
  c->stats_.store = c->store_->stats();
  return c;
}

RestoreCoordinator::RestoreCoordinator(const RestoreOptions& options, executor::Executor& executor,
                                       kv::KvCacheManager& kv, scheduler::Scheduler& scheduler,
                                       uint64_t model_fingerprint)
    : options_(options),
      heavy_hitters_(store::heavy_hitter_codec(options.store.adaptcache.fixed_codec)),
      executor_(executor),
      kv_(kv),
      scheduler_(scheduler),
      model_fingerprint_(model_fingerprint),
      followers_(executor.store_followers()) {}

RestoreCoordinator::~RestoreCoordinator() {
  // Sequences still open give their reservations back (the engine finishes them first); the
  // other ranks' stores, stopping with the executor, give theirs back themselves.
  followers_ = nullptr;
  for (auto& [seq, sequence] : sequences_) {
    end_save(seq, *sequence, /*publish=*/false);
    if (sequence->preloaded) store_->release(*sequence->preloaded, 0);
  }
}

kv::ChunkHash RestoreCoordinator::root(const std::string& tenant) const {
  return kv::prefix_root(model_fingerprint_, kv_.format(), kv_.geometry().block_size_tokens,
                         tenant);
}

void RestoreCoordinator::look_up_shared(std::span<const TokenId> prompt,
                                        const SequenceInfo& info) const {
  if (info.scores_prompt) return;
  const std::string session = store_session_key(info.session);
  store_->look_up_shared(prompt, root(info.tenant), session);
  if (followers_ != nullptr) followers_->look_up_shared(prompt, root(info.tenant), session);
}

LoadedPrefix RestoreCoordinator::stored_prefix(std::span<const TokenId> prompt,
                                              const SequenceInfo& info) const {
  LoadedPrefix out;
  if (info.scores_prompt) return out;
  if (std::optional<store::StoreMatch> m =
          store_->peek(prompt, root(info.tenant), store_session_key(info.session))) {
    out.tokens = m->num_chunks * kv_.geometry().block_size_tokens;
    out.tier = store_->tier_name(m->tier);
  }
  return out;
}

StatusOr<int32_t> RestoreCoordinator::task_index(std::string_view family) const {
  const store::AdaptCacheOptions& ac = store_->options().adaptcache;
  if (!ac.enabled) return 0;
  const int32_t task = ac.task_index(family);
  if (task >= 0) return task;
  std::string listed;
  for (const std::string& t : ac.tasks) listed += (listed.empty() ? "" : ", ") + t;
  return invalid_argument_error("kv_task: '" + std::string(family) +
                                "' is not a task family of the AdaptCache profile (" +
                                (listed.empty() ? std::string("it lists none") : listed) + ")");
}

bool RestoreCoordinator::end_session(const std::string& session) {
  if (session.empty()) return false;
  if (followers_ != nullptr) followers_->erase_session(store_session_key(session));
  return store_->erase_session(store_session_key(session));
}

RestoreStats RestoreCoordinator::stats() const {
  RestoreStats stats = stats_;
  stats.store = store_->stats();
  if (followers_ != nullptr) {
    stats.rank_stores = followers_->rank_stats();
    for (store::StoreStats& rank : stats.rank_stores) {  // every rank has rank 0's tier stack
      for (size_t t = 0; t < rank.tiers.size() && t < stats.store->tiers.size(); ++t) {
        rank.tiers[t].name = stats.store->tiers[t].name;
      }
    }
  }
  return stats;
}

std::optional<store::StoreMatch> RestoreCoordinator::look_up(SeqId seq,
                                                             std::span<const TokenId> prompt,
                                                             SequenceInfo info) {
  auto sequence = std::make_unique<Sequence>();
  info.session = store_session_key(info.session);
  sequence->info = std::move(info);
  sequence->lookup_at = store_->num_publications();
  std::optional<store::StoreMatch> match;
  if (!sequence->info.scores_prompt) {
    match = store_->find(prompt, root(sequence->info.tenant), sequence->info.session);
    held_by_all_ranks(match);
  }
  const int64_t block = kv_.geometry().block_size_tokens;
  // (More than chunk 0 matched: the prompt holds the links up to the seed's.)
  if (match && match->num_chunks > 1 && match->skipped_chunks > 0 &&
      match->token_offset == match->skipped_chunks * block) {
    kv::ChunkHash seed = root(sequence->info.tenant);
    for (int64_t b = 0; b <= match->skipped_chunks; ++b) {
      seed = kv::chain_hash(seed, prompt.subspan(b * block, block));
    }
    sequence->links = Sequence::ResumedLinks{match->skipped_chunks, seed};
  }
  sequences_[seq] = std::move(sequence);
  return match;
}

void RestoreCoordinator::admitted(SeqId seq, int64_t dropped_tokens,
                                  const std::optional<store::StoreMatch>& match) {
  Sequence& sequence = *sequences_.at(seq);
  sequence.dropped_tokens = dropped_tokens;
  // Dropping more than the item did (the context window) breaks the links.
  if (sequence.links &&
      dropped_tokens != sequence.links->skipped_chunks * kv_.geometry().block_size_tokens) {
    sequence.links.reset();
  }
  if (match) attach(seq, sequence, *match);
}

void RestoreCoordinator::forked(SeqId parent, SeqId child) {
  const Sequence& from = *sequences_.at(parent);
  auto sequence = std::make_unique<Sequence>();
  sequence->info = {from.info.tenant, /*session=*/{}, from.info.scores_prompt, from.info.task};
  sequence->lookup_at = store_->num_publications();
  sequence->dropped_tokens = from.dropped_tokens;
  sequence->links = from.links;
  sequence->whole_chunks = from.whole_chunks;  // it shares the parent's restored blocks
  sequences_[child] = std::move(sequence);
}

void RestoreCoordinator::attach(SeqId seq, Sequence& sequence, const store::StoreMatch& match) {
  const int64_t stored_drop = match.exact ? 0 : match.token_offset;
  // Truncation only grows, in whole blocks: the sequence's block j >= 1 is the item's chunk
  // j + shift.
  const int64_t shift = (sequence.dropped_tokens - stored_drop) / kv_.geometry().block_size_tokens;
  // Whole chunks are valid together only: not with some of them left out.
  if (shift < 0 || match.num_chunks == 0 || (shift > 0 && match.whole_chunks > 0)) return;
  sequence.whole_chunks = match.whole_chunks;
  Sequence::StoredPrefix stored{match.item, {0}, match.skipped_chunks};
  for (int64_t chunk = 1 + shift; chunk < match.num_chunks; ++chunk) stored.chunks.push_back(chunk);
  kv_.set_external_prefix(seq, std::ssize(stored.chunks),
                          /*exact=*/sequence.dropped_tokens == 0);
  sequence.stored = std::move(stored);
}

void RestoreCoordinator::held_by_all_ranks(std::optional<store::StoreMatch>& match) const {
  if (followers_ == nullptr || !match) return;
  const std::optional<store::StoredRun> run =
      store_->describe_run(match->item, 0, match->num_chunks);
  const int64_t held =
      run ? followers_->held_by_all(*run, store_->chunk_hashes(match->item, match->num_chunks)) : 0;
  if (held == 0 || held < match->whole_chunks) {
    match.reset();
  } else {
    match->num_chunks = std::min(match->num_chunks, held);
  }
}

void RestoreCoordinator::look_up_again(SeqId seq, Sequence& sequence) {
  sequence.lookup_at = store_->num_publications();
  std::optional<store::StoreMatch> match =
      store_->find(kv_.tokens(seq), root(sequence.info.tenant), sequence.info.session);
  held_by_all_ranks(match);
  if (match && match->exact) attach(seq, sequence, *match);
}

void RestoreCoordinator::before_schedule() {
  const int64_t publications = store_->num_publications();
  int64_t seen = 0;
  for (SeqId seq : scheduler_.waiting()) {
    if (seen++ == options_.lookup_depth) return;
    Sequence& sequence = *sequences_.at(seq);
    // A sequence holding blocks (swapped, or admitted earlier) is past its first commit.
    if (sequence.stored || sequence.lookup_at == publications || sequence.load_failed ||
        !sequence.may_look_up_again() || kv_.is_swapped(seq) || !kv_.tables(seq).empty()) {
      continue;
    }
    look_up_again(seq, sequence);
  }
}

void RestoreCoordinator::recompute(SeqId seq, Sequence& sequence,
                                   scheduler::ScheduledBatch& batch) {
  scheduler_.restart(seq);
  sequence.stored.reset();
  sequence.load_failed = true;
  sequence.whole_chunks = 0;
  std::erase_if(batch.chunks, [&](const scheduler::ScheduledChunk& c) { return c.seq == seq; });
}

StatusOr<store::TierIndex> RestoreCoordinator::pin_load(Sequence& sequence,
                                                        const kv::BlockLoad& load,
                                                        std::span<const int64_t> rows,
                                                        executor::KvLoad* kv_load) {
  const Sequence::StoredPrefix stored = *std::move(sequence.stored);
  sequence.stored.reset();
  std::vector<store::StoreLease> pinned;
  std::vector<store::StoredRun> runs;  // for the other ranks' stores
  store::TierIndex tier = store::kDramTier;
  if (sequence.preloaded) {
    // Pinned since its pre-load: chunk i of the lease holds block i.
    const std::vector<const std::byte*>& held = sequence.preloaded->chunks;
    tier = sequence.preloaded->served_from;
    kv_load->chunks.assign(held.begin() + load.first_block,
                           held.begin() + load.first_block + load.num_blocks);
    pinned.push_back(*std::move(sequence.preloaded));
    sequence.preloaded.reset();
  }
  // The rest, one lease per run of consecutive chunks.
  const int64_t end = load.first_block + load.num_blocks;
  for (int64_t j = load.first_block + std::ssize(kv_load->chunks); j < end;) {
    int64_t run = 1;
    while (j + run < end && stored.chunks[j + run] == stored.chunks[j] + run) ++run;
    StatusOr<store::StoreLease> lease =
        store_->acquire(stored.item, stored.chunks[j], run, stored.skipped_chunks);
    if (!lease.ok()) {
      for (const store::StoreLease& held : pinned) store_->release(held, 0);
      return lease.status();
    }
    tier = std::max(tier, lease->served_from);
    // Pinned leases of one item share its codec (the store re-encodes only unpinned items).
    kv_load->encoding = codec_formats_[lease->codec];
    const size_t at = kv_load->chunks.size();
    if (!reads_stored_layers(lease->first_layers, j, rows, kv_.geometry().block_size_tokens)) {
      store_->release(*lease, 0);
      for (const store::StoreLease& held : pinned) store_->release(held, 0);
      return not_found_error("KV store: conversation item " + std::to_string(stored.item) +
                             " keeps fewer layers than its load reads (changed since planned)");
    }
    kv_load->chunks.insert(kv_load->chunks.end(), lease->chunks.begin(), lease->chunks.end());
    if (followers_ != nullptr) {
      std::optional<store::StoredRun> named =
          store_->describe_run(stored.item, stored.chunks[j], run);
      STRATA_CHECK(named.has_value()) << "a pinned run of chunks is not stored";
      runs.push_back(*std::move(named));
    }
    pinned.push_back(*std::move(lease));
    if (!pinned.back().layer_pairs.empty()) {
      const Status restored = unmerge_load(pinned.back(), std::span(kv_load->chunks).subspan(at));
      if (!restored.ok()) {
        for (const store::StoreLease& held : pinned) store_->release(held, 0);
        return restored;
      }
    }
    j += run;
  }
  step_leases_.insert(step_leases_.end(), std::make_move_iterator(pinned.begin()),
                      std::make_move_iterator(pinned.end()));
  for (store::StoredRun& run : runs) followers_->load(kv_load->seq, std::move(run));
  return tier;
}

StatusOr<store::TierIndex> RestoreCoordinator::stream_load(SeqId seq, Sequence& sequence,
                                                           const kv::BlockLoad& load,
                                                           std::span<const int64_t> rows,
                                                           executor::KvLoad* kv_load) {
  const Sequence::StoredPrefix& stored = *sequence.stored;
  const int64_t block = kv_.geometry().block_size_tokens;
  const int64_t first = load.first_block, last = load.first_block + load.num_blocks - 1;
  // A restoration's history is an untruncated prompt: consecutive chunks of its item.
  STRATA_CHECK_EQ(stored.chunks[last] - stored.chunks[first], last - first);
  StatusOr<store::LayeredLease> lease =
      store_->pin_layers(stored.item, stored.chunks[first], load.num_blocks, stored.skipped_chunks);
  if (!lease.ok() && lease.status().code() == StatusCode::kFailedPrecondition) {
    return pin_load(sequence, load, rows, kv_load);  // encoded: decoded whole
  }
  sequence.stored.reset();
  if (!lease.ok()) return lease.status();
  if (!reads_stored_layers(lease->lease.first_layers, first, rows, block)) {
    store_->release(lease->lease, 0);
    return not_found_error(
        "KV store: conversation item " + std::to_string(lease->lease.item) +
        " keeps fewer layers than its restoration reads (changed since planned)");
  }
  const store::TierIndex tier = lease->lease.served_from;
  // Merged chunks, whole in DRAM too, are restored beside the pass (StreamedRead).
  const std::vector<kv::krul::LayerPair> pairs = lease->lease.layer_pairs;
  kv_load->chunks.clear();
  for (int64_t j = 0; j < load.num_blocks; ++j) {
    const bool whole = lease->from[j] == store::kDramTier && pairs.empty();
    kv_load->chunks.push_back(whole ? lease->lease.chunks[j] : nullptr);
  }
  if (std::ranges::find(kv_load->chunks, nullptr) == kv_load->chunks.end()) {  // nothing to read
    step_leases_.push_back(std::move(lease->lease));
    return tier;
  }
  // Layer l loads the blocks from its recompute boundary on.
  std::vector<int64_t> layer_first;
  for (const int64_t computed : rows) {
    layer_first.push_back(std::max(computed / block, first) - first);
  }
  StreamedRead::Unmerge unmerge;
  if (!pairs.empty()) {
    unmerge = [this, pairs](std::span<const std::byte* const> in, std::span<std::byte* const> out,
                            int32_t begin, int32_t end) {
      return executor_.unmerge_kv_chunks(merged_form_, pairs, in, out, begin, end);
    };
  }
  auto read = std::make_shared<StreamedRead>(*store_, *std::move(lease), std::move(layer_first),
                                             std::move(unmerge));
  kv_load->arrivals = read;
  // Counted as restore() counts a load: the whole history (it starts at block 0).
  streamed_.push_back(
      {seq, std::move(read), (last + 1) * block, tier, pairs.empty() ? 0 : load.num_blocks});
  return tier;
}

void RestoreCoordinator::finish_streamed_loads(const executor::ForwardResult* result) {
  for (const auto& [seq, read, tokens, tier, merged_chunks] : streamed_) {
    StreamedRead::Outcome outcome = read->finish();
    if (result != nullptr &&
        std::ranges::find(result->failed_loads, seq) == result->failed_loads.end()) {
      stats_.store_loaded_tokens[store_->tier_name(tier)] += tokens;
      stats_.merged_chunks_loaded += merged_chunks;
    }
    if (outcome.chunks > 0) {
      update_average(pin_seconds_per_chunk_[tier], outcome.seconds / outcome.chunks);
    }
    if (outcome.restored_layers > 0) {
      update_average(restore_seconds_per_layer_,
                     outcome.restore_seconds / static_cast<double>(outcome.restored_layers));
    }
    if (!outcome.status.ok()) {
      spdlog::debug("KV store: sequence {}'s streamed load failed: {}", seq.value,
                    outcome.status.to_string());
    }
    step_leases_.push_back(std::move(outcome.lease));
  }
  streamed_.clear();
}

std::vector<LoadedPrefix> RestoreCoordinator::restore(scheduler::ScheduledBatch& batch,
                                                      executor::ForwardBatch& forward) {
  // A sequence preempted to recompute lost its blocks: it may load its prefix again (unless
  // swapped out, or already admitted again in this step (it holds blocks), or truncated, or
  // scoring its prompt).
  for (SeqId seq : batch.preempted) {
    Sequence& sequence = *sequences_.at(seq);
    sequence.stored.reset();
    if (!kv_.is_swapped(seq)) sequence.whole_chunks = 0;  // a swapped one keeps its KV
    if (kv_.is_swapped(seq) || !kv_.tables(seq).empty() || !sequence.may_look_up_again()) continue;
    look_up_again(seq, sequence);
  }
  std::vector<LoadedPrefix> loaded;
  restorations_.clear();  // a step without a pass applied none
  const int64_t block = kv_.geometry().block_size_tokens;
  // Rows the step's budget leaves for recomputed history.
  int64_t scheduled = 0;
  for (const scheduler::ScheduledChunk& chunk : batch.chunks) scheduled += chunk.num_tokens;
  int64_t room = options_.max_batched_tokens - scheduled;
  for (const kv::BlockLoad& load : batch.copies.loads) {
    Sequence& sequence = *sequences_.at(load.seq);
    STRATA_CHECK(sequence.stored.has_value()) << "a load for a sequence without a stored item";
    // A restoration recomputes the history's first blocks at every layer: they are not loaded.
    kv::BlockLoad pinned = load;
    std::vector<int64_t> rows;
    // An untruncated prompt's blocks are consecutive chunks of its item (a truncated one's item,
    // made by truncation, never keeps a stored suffix).
    std::vector<int32_t> first_layers;
    std::vector<kv::krul::LayerPair> pairs;
    std::optional<store::TierIndex> from;
    if (sequence.dropped_tokens == 0) {
      const Sequence::StoredPrefix& stored = *sequence.stored;
      from = store_->locate(stored.item, stored.chunks[load.first_block], load.num_blocks,
                            stored.skipped_chunks, &first_layers, &pairs);
    }
    if (load.first_block == 0 && sequence.dropped_tokens == 0) {
      // (An item gone since: pin_load reports it.)
      if (from) {
        rows = restoration_plan(load.num_blocks * block, room, *from, scheduled,
                                recompute_floor(first_layers), pairs);
      }
    } else if (!first_layers.empty()) {
      // Its first blocks are in the pool (the prefix cache), so its history cannot be restored
      // from position 0 and a plain load would read layers the stored suffix left out.
      recompute(load.seq, sequence, batch);
      ++stats_.suffix_recomputes;
      continue;
    }
    if (!rows.empty()) {
      pinned.first_block = rows.back() / block;
      pinned.num_blocks -= pinned.first_block;
      room -= rows.front();
    }
    executor::KvLoad kv_load{load.seq, pinned.first_block, {}, std::nullopt};
    const auto pin_start = std::chrono::steady_clock::now();
    StatusOr<store::TierIndex> tier = store::kDramTier;
    if (pinned.num_blocks > 0 && !rows.empty() && executor_.streams_loads() &&
        !sequence.preloaded) {
      tier = stream_load(load.seq, sequence, pinned, rows, &kv_load);
    } else if (pinned.num_blocks > 0) {
      tier = pin_load(sequence, pinned, rows, &kv_load);
    } else {
      sequence.stored.reset();  // every block recomputed
      sequence.whole_chunks = 0;
    }
    if (!tier.ok()) {
      // The chunks vanished or failed their checksums (the store dropped the item): compute the
      // prompt.
      spdlog::debug(
          "KV store: a resumed prompt's load of {} stored blocks failed ({}); it is "
          "recomputed",
          pinned.num_blocks, tier.status().to_string());
      recompute(load.seq, sequence, batch);
      ++stats_.store_load_failures;
      continue;
    }
    if (pinned.num_blocks > 0 && !kv_load.arrivals) {  // streamed: measured after the pass
      update_average(pin_seconds_per_chunk_[*tier],
                     seconds_since(pin_start) / static_cast<double>(pinned.num_blocks));
    }
    if (!rows.empty()) restorations_[load.seq] = std::move(rows);
    const int64_t tokens = load.num_blocks * block;
    const std::string& name = store_->tier_name(*tier);
    if (!kv_load.arrivals) stats_.store_loaded_tokens[name] += tokens;  // streamed: after the pass
    loaded.push_back({load.seq, tokens, name});
    if (!kv_load.chunks.empty()) forward.loads.push_back(std::move(kv_load));
  }
  publish_queue();
  return loaded;
}

void RestoreCoordinator::publish_queue() {
  std::vector<store::ItemId> queue;
  for (SeqId seq : scheduler_.waiting()) {
    const Sequence& sequence = *sequences_.at(seq);
    if (sequence.stored) queue.push_back(sequence.stored->item);
  }
  if (queue == queue_) return;
  queue_ = queue;
  if (followers_ != nullptr) {
    std::vector<store::StoredRun> named;
    for (SeqId seq : scheduler_.waiting()) {
      const Sequence& sequence = *sequences_.at(seq);
      if (!sequence.stored) continue;
      const int64_t end = sequence.stored->chunks.back() + 1;
      std::optional<store::StoredRun> run = store_->describe_run(sequence.stored->item, 0, end);
      if (run) named.push_back(*std::move(run));
    }
    followers_->set_queue(std::move(named));
  }
  store_->set_queue(std::move(queue));
}

void RestoreCoordinator::plan_copies(executor::ForwardBatch& forward) {
  plan_restorations(forward);
  observe_attention(forward);
  plan_saves(forward);
  plan_preload(forward);
  // The streamed reads start once the step's copies are planned.
  for (const StreamedLoad& load : streamed_) load.read->start();
}

bool RestoreCoordinator::observes_attention() const {
  return options_.store.layer_pairing == store::LayerPairing::kKrul || heavy_hitters_;
}

void RestoreCoordinator::observe_attention(executor::ForwardBatch& forward) {
  if (!observes_attention()) return;
  for (executor::SequenceChunk& chunk : forward.chunks) {
    // A restoration's layers compute different rows: its pass is not observed (its decode steps
    // are).
    chunk.observe_attention = chunk.restored_tokens == 0 && sequences_.at(chunk.seq)->saves_kv();
    chunk.observe_row_stride = options_.store.krul_row_stride;
  }
}

void RestoreCoordinator::plan_saves(executor::ForwardBatch& forward) {
  const int64_t block = kv_.geometry().block_size_tokens;
  for (const executor::SequenceChunk& chunk : forward.chunks) {
    Sequence& sequence = *sequences_.at(chunk.seq);
    // A sequence off the pool (FreeKV's layers hold its KV) saves no more: its item ends with
    // the blocks the pool computed, which the pass that moved it saved.
    if (!sequence.saves_kv() || kv_.is_off_pool(chunk.seq)) continue;
    const std::vector<TokenId>& tokens = kv_.tokens(chunk.seq);
    const int64_t end_block = (chunk.start_position + std::ssize(chunk.tokens)) / block;
    auto hash_up_to = [&](std::vector<kv::ChunkHash>& chain, int64_t blocks) {
      for (int64_t b = std::ssize(chain); b < blocks; ++b) {
        const kv::ChunkHash previous = b == 0                     ? root(sequence.info.tenant)
                                       : b == 1 && sequence.links ? sequence.links->seed
                                                                  : chain.back();
        chain.push_back(
            kv::chain_hash(previous, std::span<const TokenId>(tokens).subspan(b * block, block)));
      }
    };
    if (!sequence.saving || sequence.saving->ticket.item == 0) {
      // Starts with the first pass that completes a block, reserving every full block the
      // sequence has (the prompt's, computed over this and the next passes). Without any DRAM
      // room now (counted by the store) the next pass asks again.
      if (end_block == 0) continue;
      Sequence::Saving& saving = sequence.saving ? *sequence.saving : sequence.saving.emplace();
      hash_up_to(saving.chain, std::ssize(tokens) / block);
      const store::SaveRequest request{sequence.info.session,
                                       sequence.dropped_tokens == 0,
                                       sequence.dropped_tokens,
                                       saving.chain,
                                       sequence.links ? sequence.links->skipped_chunks : 0,
                                       sequence.info.task,
                                       sequence.whole_chunks};
      StatusOr<store::SaveTicket> ticket = store_->begin_save(request);
      if (!ticket.ok()) continue;
      if (followers_ != nullptr) {  // as many chunks as rank 0 got room for
        store::SaveRequest reserved = request;
        reserved.chain.resize(ticket->first_chunk + ticket->destinations.size());
        followers_->begin_save(chunk.seq, reserved);
      }
      saving.ticket = *std::move(ticket);
      saving.short_of_room = std::ssize(saving.ticket.destinations) <
                             std::ssize(saving.chain) - saving.ticket.first_chunk;
    }
    Sequence::Saving& saving = *sequence.saving;
    store::SaveTicket& ticket = saving.ticket;
    int64_t reserved_end = ticket.first_chunk + std::ssize(ticket.destinations);
    if (end_block > reserved_end) {
      // Blocks the store had no room for so far are still in the pool: asked for again.
      hash_up_to(saving.chain, end_block);
      const int64_t wanted = end_block - reserved_end;
      const int64_t got = store_->extend_save(
          &ticket, std::span<const kv::ChunkHash>(saving.chain).subspan(reserved_end, wanted));
      if (followers_ != nullptr && got > 0) {
        followers_->extend_save(
            chunk.seq, reserved_end,
            std::span<const kv::ChunkHash>(saving.chain).subspan(reserved_end, got));
      }
      saving.short_of_room = saving.short_of_room || got < wanted;
      reserved_end += got;
    }
    const int64_t first = ticket.first_chunk + saving.written;
    const int64_t count = std::min(end_block, reserved_end) - first;
    if (count <= 0) continue;
    executor::KvSave& save = forward.saves.emplace_back();
    save.seq = chunk.seq;
    save.first_block = first;
    save.chunks.assign(ticket.destinations.begin() + saving.written,
                       ticket.destinations.begin() + saving.written + count);
    saving.written += count;
  }
}

void RestoreCoordinator::after_pass(const executor::ForwardBatch& forward,
                                    const executor::ForwardResult* result, double seconds) {
  finish_streamed_loads(result);
  for (const store::StoreLease& lease : step_leases_) {
    store_->release(lease, result != nullptr ? result->load_seconds /
                                                   static_cast<double>(step_leases_.size())
                                             : 0.0);
  }
  step_leases_.clear();
  unmerged_chunks_.clear();
  // A request that ran keeps no pre-load (the pass used or dropped it).
  for (const executor::SequenceChunk& chunk : forward.chunks) {
    release_preload(chunk.seq, *sequences_.at(chunk.seq));
  }
  if (result == nullptr) return;

  const int64_t chunk_bytes = executor_.kv_chunk_bytes();
  int64_t loaded = 0, saved = 0;
  for (const executor::KvLoad& load : forward.loads) loaded += std::ssize(load.chunks);
  const int64_t loaded_bytes = result->load_copy_bytes;
  for (const executor::KvSave& save : forward.saves) saved += std::ssize(save.chunks);
  // The token-layers the pass computed: a restoring chunk's layers compute only their rows of
  // the history (computed_rows) besides the new tokens; the rest of it is loaded.
  const int64_t layers = executor_.config().num_layers;
  int64_t token_layers = 0;
  bool restoring = false;
  for (const executor::SequenceChunk& chunk : forward.chunks) {
    token_layers +=
        (std::ssize(chunk.tokens) - chunk.restored_tokens) * layers +
        std::accumulate(chunk.computed_rows.begin(), chunk.computed_rows.end(), int64_t{0});
    restoring = restoring || chunk.restored_tokens > 0;
  }
  if (restoring) {
    stats_.restore_pass_seconds += seconds;
    stats_.restore_wait_seconds += result->load_wait_seconds;
  }
  // Moving averages that size the read buffer and Krul's plans (first: a save's piece below is
  // planned with this pass's costs).
  if (loaded_bytes > 0 && result->load_copy_seconds > 0) {
    update_average(load_bytes_per_second_,
                   static_cast<double>(loaded_bytes) / result->load_copy_seconds);
  }
  // Prefill-sized passes only: a few decode tokens measure the per-pass overhead instead. A pass
  // that waited for its loads computed for the rest of its time.
  constexpr int64_t kMinPrefillTokens = 64;
  const double computing = seconds - result->load_wait_seconds;
  if (token_layers >= kMinPrefillTokens * layers && computing > 0) {
    update_average(prefill_seconds_per_token_layer_, computing / static_cast<double>(token_layers));
  }
  const std::vector<SeqId>& failed = result->failed_loads;
  for (const executor::KvSave& save : forward.saves) {
    if (std::ranges::find(failed, save.seq) != failed.end()) continue;  // given back below
    Sequence::Saving& saving = *sequences_.at(save.seq)->saving;
    if (result->saves_written) saving.copies.push_back(result->saves_written);
    saving.seconds += result->save_seconds * static_cast<double>(std::ssize(save.chunks)) /
                      static_cast<double>(saved);
    // Short of DRAM: what is written is published now; the save goes on after it. Published,
    // it may go below DRAM before the turn ends: it keeps the layers a plan of it loads.
    if (saving.short_of_room && saving.written == std::ssize(saving.ticket.destinations)) {
      Sequence& sequence = *sequences_.at(save.seq);
      if (options_.store.stored_suffix && sequence.dropped_tokens == 0) {
        store_suffix(saving.ticket.item,
                     saving.ticket.first_chunk + std::ssize(saving.ticket.destinations),
                     /*turn_end=*/false, {});
      }
      commit_written(save.seq, sequence, /*last=*/false);
    }
  }
  // A streamed load that failed left its sequence's KV incomplete: recomputed from scratch.
  for (SeqId seq : failed) {
    Sequence& sequence = *sequences_.at(seq);
    spdlog::debug("KV store: a resumed prompt's load failed during its pass; it is recomputed");
    const executor::SequenceChunk& chunk =
        *std::ranges::find(forward.chunks, seq, &executor::SequenceChunk::seq);
    if (chunk.restored_tokens > 0) count_restoration(chunk, -1);  // it restored nothing
    end_save(seq, sequence, /*publish=*/false);
    scheduler_.restart(seq);
    sequence.load_failed = true;
    sequence.whole_chunks = 0;
    ++stats_.store_load_failures;
  }
  if (loaded > 0) {
    stats_.pool_bytes_loaded += loaded_bytes;
    stats_.pool_load_seconds += result->load_seconds;
    ++stats_.pool_loads;
  }
  if (saved > 0) {
    stats_.pool_bytes_saved += saved * chunk_bytes;
    stats_.pool_save_seconds += result->save_seconds;
    ++stats_.pool_saves;
  }
}

void RestoreCoordinator::end_save(SeqId seq, Sequence& sequence, bool publish) {
  if (!sequence.saving) return;
  Sequence::Saving& saving = *sequence.saving;
  // A finished turn has computed every block it reserved; anything else gives the chunks back,
  // after the copies into them are done (what a save short of room published stays).
  if (!publish || saving.written != std::ssize(saving.ticket.destinations)) {
    for (const auto& wait : saving.copies) wait();
    store_->abort_save(saving.ticket);
    if (followers_ != nullptr) followers_->end_save(seq, store::SaveEnd::kAbort);
  } else {
    commit_written(seq, sequence, /*last=*/true);
  }
  sequence.saving.reset();
}

void RestoreCoordinator::commit_written(SeqId seq, Sequence& sequence, bool last) {
  Sequence::Saving& saving = *sequence.saving;
  store::SaveTicket& ticket = saving.ticket;
  if (!last && ticket.destinations.empty()) return;
  stats_.store_saved_tokens += std::ssize(ticket.destinations) * kv_.geometry().block_size_tokens;
  std::function<void()> wait;
  if (!saving.copies.empty()) {
    wait = [copies = std::move(saving.copies)] {
      for (const auto& c : copies) c();
    };
  }
  if (last) {
    store_->commit_save(std::move(ticket), std::move(wait), saving.seconds);
  } else {
    ticket = store_->continue_save(std::move(ticket), std::move(wait), saving.seconds);
  }
  if (followers_ != nullptr) {
    followers_->end_save(seq, last ? store::SaveEnd::kCommit : store::SaveEnd::kContinue);
  }
  saving.written = 0;
  saving.copies.clear();
  saving.seconds = 0;
}

void RestoreCoordinator::finish(SeqId seq, bool publish) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  if (publish && it->second->saving) {
    const store::ItemId item = it->second->saving->ticket.item;
    std::optional<kv::krul::AttentionStats> stats;
    if (observes_attention()) stats = executor_.take_attention_stats(seq);
    std::vector<kv::krul::LayerPair> pairs;
    if (options_.store.layer_pairing != store::LayerPairing::kNone) {
      // This turn's pairs replace the item's (none: it stays unmerged).
      pairs = choose_layer_pairs(stats);
      store_->set_layer_pairs(item, pairs);
    }
    if (stats && stats->num_kv_heads > 0 && heavy_hitters_) {
      store_->set_token_mass(item, std::move(stats->token_mass));
    }
    if (options_.store.stored_suffix && it->second->dropped_tokens == 0) {
      store_suffix(item, std::ssize(it->second->saving->chain), /*turn_end=*/true, pairs);
    }
  }
  end_save(seq, *it->second, publish);
  release_preload(seq, *it->second);
  sequences_.erase(it);
}

}  // namespace strata::restore
