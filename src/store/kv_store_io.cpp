// The store's background movement between tiers, on its I/O threads: publication of saves whose
// copies finish later, demotion out of DRAM, prefetching into it, expiry, and making room.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "strata/common/check.h"
#include "strata/common/clock.h"
#include "strata/store/kv_store.h"

namespace strata::store {
namespace {

using Clock = SteadyClock;

}  // namespace

TierIndex KvStore::source_of(const Chunk& chunk) const {
  for (TierIndex t = 1; t < num_tiers(); ++t) {
    if ((chunk.tiers & (1u << t)) != 0 && usable(t)) return t;
  }
  return -1;
}

int64_t KvStore::free_dram_chunks() const { return dram_->fitting(options_.chunk_bytes); }

int64_t KvStore::capacity_chunks(TierIndex t) const {
  if (!usable(t)) return 0;
  const int64_t used = tiers_[t]->used_bytes();
  const int64_t per_chunk = t != kDramTier && tier_chunks_[t] > 0 && used > 0
                                ? std::max<int64_t>(1, used / tier_chunks_[t])
                                : tiers_[t]->footprint(options_.chunk_bytes);
  return tiers_[t]->capacity_bytes() / per_chunk;
}

int64_t KvStore::eviction_window() const {
  int64_t capacity = 0;
  for (TierIndex t = 0; t < num_tiers(); ++t) capacity += capacity_chunks(t);
  return window_length(capacity, mean_item_chunks(), std::ssize(queue_));
}

int64_t KvStore::prefetch_window() const {
  return window_length(capacity_chunks(kDramTier), mean_item_chunks(), std::ssize(queue_));
}

std::vector<ItemView> KvStore::views(TierIndex t) const {
  std::vector<ItemView> out;
  out.reserve(items_.size());
  for (const auto& [id, item] : items_) {
    ItemView v;
    v.id = id;
    v.num_chunks = std::ssize(item.chunks);
    v.in_top = item.held[kDramTier] > 0;
    v.in_lower = t != kDramTier && item.held[t] > 0;
    v.needs_fetch = item.held[kDramTier] < v.num_chunks;
    v.pinned = item.pins > 0 || item.busy || !item.pending.empty();
    v.last_access = item.last_access;
    v.stored_at = item.stored_at;
    out.push_back(v);
  }
  return out;
}

bool KvStore::reclaim_clean_dram(int64_t n) {
  while (free_dram_chunks() < n) {
    // Candidates: unpinned items whose every chunk is in DRAM and whole in a lower tier.
    std::vector<ItemView> clean;
    for (const ItemView& v : views(kDramTier)) {
      const Item& item = items_.at(v.id);
      bool whole_below = false;
      for (TierIndex t = 1; t < num_tiers() && !whole_below; ++t) {
        whole_below = usable(t) && item.held[t] == v.num_chunks;
      }
      if (v.num_chunks > 0 && item.held[kDramTier] == v.num_chunks && whole_below) {
        clean.push_back(v);
      }
    }
    const std::optional<ItemId> victim =
        choose_top_victim(options_.policy, clean, queue_, eviction_window());
    if (!victim) return false;
    drop_copy(*victim, kDramTier);
  }
  return true;
}

void KvStore::drop_item(ItemId id) {
  auto it = items_.find(id);
  if (it == items_.end()) return;
  Item& item = it->second;
  if (!item.session.empty()) {
    auto s = by_session_.find(item.session);
    if (s != by_session_.end() && s->second == id) by_session_.erase(s);
  }
  for (const Chunk& c : item.chunks) {
    auto h = by_hash_.find(c.hash);
    if (h != by_hash_.end() && h->second.first == id) by_hash_.erase(h);
  }
  if (item.pins > 0 || !item.pending.empty()) {
    // A lease still reads its chunks, or a save still writes chunks into it: unreachable now,
    // removed at the last release, or when the save is published or aborted.
    item.doomed = true;
    return;
  }
  for (TierIndex t = 0; t < num_tiers(); ++t) {
    if (item.held[t] == 0) continue;
    // A failed eviction fails its tier (its copies are unreachable then).
    (void)tiers_[t]->evict(id);
    for (int64_t i = 0; i < std::ssize(item.chunks); ++i) set_held(item, i, t, false);
  }
  if (!item.chunks.empty()) {
    published_chunks_ -= std::ssize(item.chunks);
    published_items_ -= 1;
  }
  --stats_.codec_items[item.codec];
  items_.erase(it);
}

void KvStore::drop_copy(ItemId id, TierIndex t) {
  Item& item = items_.at(id);
  ++counters_[t].evictions;
  if (item.only_in(t)) return drop_item(id);
  (void)tiers_[t]->evict(id);
  for (int64_t i = 0; i < std::ssize(item.chunks); ++i) {
    set_held(item, i, t, false);
    if (t == kDramTier) item.chunks[i].dram = nullptr;
  }
}

bool KvStore::make_room(TierIndex t, int64_t bytes, ItemId exclude) {
  while (tiers_[t]->capacity_bytes() - tiers_[t]->used_bytes() < bytes) {
    const std::optional<ItemId> victim =
        choose_lower_victim(options_.policy, views(t), queue_, eviction_window(), exclude);
    if (!victim) return false;
    drop_copy(*victim, t);
  }
  return true;
}

bool KvStore::write_down(ItemId id, TierIndex t, std::unique_lock<std::mutex>& lock) {
  if (!usable(t)) return false;
  Tier& tier = *tiers_[t];
  Item& item = items_.at(id);
  // The shared tier's records carry neither skipped chunks, layer pairs, whole chunks nor
  // stored suffixes: such items stay here.
  if (t == shared_ && (item.skipped_chunks > 0 || item.whole_chunks > 0 || item.suffix() ||
                       options_.codecs[item.codec].merged_pairs > 0)) {
    return false;
  }
  std::vector<ChunkKey> keys;
  std::vector<std::span<const std::byte>> values;
  int64_t dram_bytes = 0;
  for (int64_t i = 0; i < std::ssize(item.chunks); ++i) {
    Chunk& c = item.chunks[i];
    if ((c.tiers & (1u << t)) != 0 || c.dram == nullptr) continue;
    // A chunk's first write below DRAM fixes the layers every copy below keeps.
    if ((c.tiers & ~(1u << kDramTier)) == 0 && i < std::ssize(item.stored_layers)) {
      c.first_layer = std::max(c.first_layer, item.stored_layers[i]);
      item.suffix_chunks = item.suffix_chunks || c.first_layer > 0;
    }
    keys.push_back({id, static_cast<int32_t>(i), c.hash, c.first_layer});
    const int64_t offset = suffix_offset(item, c);
    values.emplace_back(c.dram + offset, static_cast<size_t>(value_bytes(item) - offset));
    dram_bytes += value_bytes(item) - offset;
  }
  if (keys.empty()) return item.held[t] == std::ssize(item.chunks);
  const ItemRecord record = item.record(options_);
  // Encoded off the lock (the item is busy: its DRAM copy stays), into page-aligned buffers; a
  // stored suffix is copied into one (the tier reads whole pages from the value's start).
  std::vector<AlignedBuffer> encoded;
  const Clock::time_point start = Clock::now();
  if (tier.codec() != CodecKind::kIdentity || item.suffix()) {
    lock.unlock();
    std::vector<std::byte> out;
    for (std::span<const std::byte>& v : values) {
      if (tier.codec() != CodecKind::kIdentity) {
        STRATA_CHECK(encode(tier.codec(), v, &out).ok());
        v = out;
      }
      AlignedBuffer& b = encoded.emplace_back(std::ssize(v));
      std::copy(v.begin(), v.end(), b.data());
      v = b.bytes();
    }
    lock.lock();
  }
  std::vector<int64_t> sizes;
  int64_t bytes = 0;
  for (const std::span<const std::byte>& v : values) {
    sizes.push_back(std::ssize(v));
    bytes += tier.footprint(std::ssize(v));
  }
  if (!make_room(t, bytes, id)) return false;
  std::optional<Reservation> room = tier.reserve(sizes);
  if (!room) return false;
  lock.unlock();
  const Status status = tier.put(record, *room, keys, values);
  const double seconds = seconds_since(start);
  lock.lock();
  if (!status.ok()) return false;  // the tier gave the room back; it failed
  Item& now = items_.at(id);
  int64_t stored = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    set_held(now, keys[j].index, t, true);
    stored += std::ssize(values[j]);
  }
  counters_[t].bytes_in += stored;
  counters_[kDramTier].bytes_out += dram_bytes;
  counters_[t].save_seconds += seconds;
  ++counters_[t].saves;
  return now.held[t] == std::ssize(now.chunks);
}

Status KvStore::fetch(ItemId id, int64_t first, int64_t count, std::vector<AlignedBuffer>* direct,
                      TierIndex* from, std::unique_lock<std::mutex>& lock) {
  const Item& item = items_.at(id);
  const int64_t chunk_bytes = value_bytes(item);
  // The chunks DRAM lacks, grouped by the nearest usable tier holding them.
  std::vector<std::vector<int32_t>> wanted(tiers_.size());
  std::vector<int64_t> offsets(static_cast<size_t>(count));  // where each one's value goes
  int64_t missing = 0;
  Status status;
  for (int64_t i = first; i < first + count; ++i) {
    if (item.chunks[i].dram != nullptr) continue;
    offsets[i - first] = suffix_offset(item, item.chunks[i]);
    const TierIndex t = source_of(item.chunks[i]);
    if (t < 0) {
      status = Status(StatusCode::kUnavailable, "KV store: chunk " + std::to_string(i) +
                                                    " of item " + std::to_string(id) +
                                                    " is only in a failed tier");
      break;
    }
    wanted[t].push_back(static_cast<int32_t>(i));
    ++missing;
  }
  if (direct != nullptr) direct->resize(static_cast<size_t>(count));
  std::optional<Reservation> room;
  if (direct == nullptr) {
    room = dram_->reserve(std::vector<int64_t>(static_cast<size_t>(missing), chunk_bytes));
    STRATA_CHECK(room.has_value()) << "fetch without DRAM room";
  }
  lock.unlock();
  std::vector<ChunkKey> keys;
  std::vector<std::span<const std::byte>> values;
  std::vector<int64_t> read_bytes(tiers_.size()), read_chunks(tiers_.size());
  std::vector<double> read_seconds(tiers_.size());
  *from = kDramTier;
  for (TierIndex t = 1; t < num_tiers() && status.ok(); ++t) {
    if (wanted[t].empty()) continue;
    *from = t;
    const Clock::time_point start = Clock::now();
    std::vector<AlignedBuffer> got(wanted[t].size());
    status = tiers_[t]->get(id, wanted[t], got);
    for (size_t j = 0; status.ok() && j < got.size(); ++j) {
      read_bytes[t] += got[j].size();
      // A stored suffix fills the chunk's tail; the bytes before it are zeros.
      const int64_t offset = offsets[wanted[t][j] - first];
      std::span<std::byte> raw;
      if (direct != nullptr) {
        AlignedBuffer& slot = (*direct)[wanted[t][j] - first];
        if (tiers_[t]->codec() == CodecKind::kIdentity && offset == 0) {  // the buffer is the chunk
          if (got[j].size() != chunk_bytes) {
            status = data_loss_error(
                "KV store: a chunk of conversation item " + std::to_string(id) + " holds " +
                std::to_string(got[j].size()) + " bytes, not " + std::to_string(chunk_bytes));
            break;
          }
          slot = std::move(got[j]);
          continue;
        }
        slot = AlignedBuffer(chunk_bytes);
        raw = {slot.data(), static_cast<size_t>(chunk_bytes)};
      } else {
        raw = {dram_->address(room->placements[keys.size()]), static_cast<size_t>(chunk_bytes)};
        keys.push_back({id, wanted[t][j], {}, 0});
        values.emplace_back(raw.data(), raw.size());
      }
      std::fill_n(raw.data(), offset, std::byte{0});  // what the stored suffix left out
      status = decode(tiers_[t]->codec(), got[j].bytes(), raw.subspan(static_cast<size_t>(offset)));
    }
    read_chunks[t] = std::ssize(wanted[t]);
    read_seconds[t] = seconds_since(start);
  }
  lock.lock();
  Item& now = items_.at(id);
  now.busy = false;
  idle_.notify_all();
  if (!status.ok()) {
    if (room) dram_->cancel(*room);
    ++stats_.corrupt_chunks;
    spdlog::warn("{}; dropping the conversation, its turn is recomputed", status.message());
    drop_item(id);
    return Status(StatusCode::kDataLoss, status.message());
  }
  if (room) {
    for (ChunkKey& key : keys) {
      key.hash = now.chunks[key.index].hash;
      key.first_layer = now.chunks[key.index].first_layer;
    }
    STRATA_CHECK(dram_->put(now.record(options_), *room, keys, values).ok());
    for (size_t j = 0; j < keys.size(); ++j) {
      now.chunks[keys[j].index].dram = const_cast<std::byte*>(values[j].data());
      set_held(now, keys[j].index, kDramTier, true);
    }
    counters_[kDramTier].bytes_in += std::ssize(keys) * chunk_bytes;
  }
  for (TierIndex t = 1; t < num_tiers(); ++t) {
    if (read_chunks[t] == 0) continue;
    counters_[t].bytes_out += read_bytes[t];
    counters_[t].load_seconds += read_seconds[t];
    ++counters_[t].loads;
  }
  return Status();
}

StatusOr<LayeredLease> KvStore::pin_layers(ItemId id, int64_t first, int64_t count,
                                           int64_t skipped_chunks) {
  std::unique_lock lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(Item * found, leasable(id, first + count, skipped_chunks, lock));
  Item& item = *found;
  if (!keeps_suffix(item.codec)) {
    return failed_precondition_error("KV store: conversation item " + std::to_string(id) +
                                     " is encoded; its chunks are read whole");
  }
  LayeredLease layered{{id, {}, kDramTier, item.codec, {}, nullptr, {}}, first, {}};
  if (item.codec != 0) layered.lease.layer_pairs = item.layer_pairs;
  StoreLease& lease = layered.lease;
  TierIndex farthest = kDramTier;
  std::array<bool, kMaxTiers> reading{};
  for (int64_t i = first; i < first + count; ++i) {
    const Chunk& chunk = item.chunks[i];
    if (chunk.dram != nullptr) {
      lease.chunks.push_back(chunk.dram);
      layered.from.push_back(kDramTier);
      continue;
    }
    const TierIndex t = source_of(chunk);
    if (t < 0) {  // as fetch() does with it
      ++stats_.corrupt_chunks;
      drop_item(id);
      return data_loss_error("KV store: chunk " + std::to_string(i) + " of item " +
                             std::to_string(id) + " is only in a failed tier");
    }
    if (!lease.direct) lease.direct = std::make_shared<std::vector<AlignedBuffer>>(count);
    AlignedBuffer& buffer = (*lease.direct)[i - first];
    buffer = AlignedBuffer(value_bytes(item));
    lease.chunks.push_back(buffer.data());
    layered.from.push_back(t);
    farthest = std::max(farthest, t);
    reading[t] = true;
  }
  lease.first_layers = first_layers_of(item, first, count);
  if (farthest > kDramTier) {
    ++counters_[farthest].hits;
    ++counters_[kDramTier].misses;
    for (TierIndex t = 1; t < num_tiers(); ++t) counters_[t].loads += reading[t];
    lease.served_from = farthest;
  } else {
    ++counters_[item.fetched_from].hits;
    lease.served_from = item.fetched_from;
  }
  item.fetched_from = kDramTier;
  ++item.pins;
  touch(item);
  record_use(item);
  return layered;
}

Status KvStore::read_layers(LayeredLease* layered, std::span<const LayerPart> parts) {
  const StoreLease& lease = layered->lease;
  const auto offset_of = [&](int32_t layer) {
    return layer_offset(lease.codec, lease.layer_pairs, layer);
  };
  const int64_t value_end = offset_of(options_.chunk_layers);
  std::array<int64_t, kMaxTiers> bytes{};
  std::array<double, kMaxTiers> seconds{};
  Status status;
  for (const LayerPart& part : parts) {
    TierIndex& from = layered->from[part.chunk];
    if (from == kDramTier) continue;
    const auto index = static_cast<int32_t>(layered->first + part.chunk);
    AlignedBuffer& buffer = (*lease.direct)[part.chunk];
    const Clock::time_point start = Clock::now();
    const Tier& tier = *tiers_[from];
    // A stored suffix's value starts at its first layer.
    const int32_t first_layer = lease.first_layers.empty() ? 0 : lease.first_layers[part.chunk];
    const int64_t stored = offset_of(first_layer);
    int64_t read = 0;
    if (part.layer_begin < first_layer) {
      status =
          internal_error("KV store: a read of layers from " + std::to_string(part.layer_begin) +
                         " of conversation item " + std::to_string(lease.item) +
                         ", whose chunk keeps layers from " + std::to_string(first_layer));
    } else if (tier.reads_parts()) {
      const int64_t offset = offset_of(part.layer_begin);
      read = offset_of(part.layer_end) - offset;  // none for a merged pair's shallow layers
      if (read > 0) {
        status = tier.get_part(lease.item, index, offset - stored, read, buffer.data() + offset);
      }
    } else {
      std::vector<AlignedBuffer> got(1);
      status = tier.get(lease.item, std::span(&index, 1), got);
      if (status.ok()) {
        status = decode(tier.codec(), got[0].bytes(),
                        {buffer.data() + stored, static_cast<size_t>(value_end - stored)});
      }
      read = got[0].size();
    }
    if (!status.ok()) break;  // counted as fetch() counts a failed read: not at all
    bytes[from] += read;
    seconds[from] += seconds_since(start);
    if (!tier.reads_parts()) from = kDramTier;  // whole now
  }
  std::scoped_lock lock(mutex_);
  for (TierIndex t = 1; t < num_tiers(); ++t) {
    counters_[t].bytes_out += bytes[t];
    counters_[t].load_seconds += seconds[t];
  }
  if (status.ok()) return status;
  ++stats_.corrupt_chunks;
  spdlog::warn("{}; dropping the conversation, its turn is recomputed", status.message());
  drop_item(lease.item);  // pinned: unreachable now, gone at its release
  return Status(StatusCode::kDataLoss, status.message());
}

void KvStore::prefetch(ItemId id) {
  std::unique_lock lock(mutex_);
  TierIndex from = kDramTier;
  if (fetch(id, 0, std::ssize(items_.at(id).chunks), nullptr, &from, lock).ok()) {
    ++stats_.prefetches;
  }
}

void KvStore::demote(ItemId id) {
  std::unique_lock lock(mutex_);
  bool persisted = false;
  for (TierIndex t = 1; t < num_tiers(); ++t) persisted = write_down(id, t, lock) || persisted;
  Item& item = items_.at(id);
  item.busy = false;
  dram_chunks_demoting_ -= item.held[kDramTier];
  if (!persisted) {  // no room below: the item leaves the store
    ++counters_[kDramTier].evictions;
    return drop_item(id);
  }
  drop_copy(id, kDramTier);
}

void KvStore::expire_items() {
  // A scan of every item under the lock the step thread also takes: at most once a second.
  const Clock::time_point now = Clock::now();
  if (options_.ttl.count() == 0 || now - last_expiry_scan_ < std::chrono::seconds(1)) return;
  last_expiry_scan_ = now;
  const Clock::time_point limit = now - options_.ttl;
  std::vector<ItemId> expired;
  for (const auto& [id, item] : items_) {
    if (item.pins == 0 && !item.busy && item.pending.empty() && item.touched < limit) {
      expired.push_back(id);
    }
  }
  for (ItemId id : expired) drop_item(id);
  stats_.expired += std::ssize(expired);
}

KvStore::Decision KvStore::next_action(bool claim) {
  if (Decision d = codec_decision(); d.action != Action::kNone) {
    if (claim && d.action != Action::kEvict) {
      Item& item = items_.at(d.item);
      item.busy = true;
      if (d.action == Action::kDemote) dram_chunks_demoting_ += item.held[kDramTier];
    }
    return d;
  }
  const std::vector<ItemView> all = views(kDramTier);
  const auto reserve = static_cast<int64_t>(
      std::ceil(options_.dram_reserve_fraction * static_cast<double>(capacity_chunks(kDramTier))));
  const int64_t prefetch_window_length = prefetch_window();
  auto first_position = [&](ItemId item) {
    auto it = std::find(queue_.begin(), queue_.end(), item);
    return it == queue_.end() ? INT64_MAX : it - queue_.begin();
  };
  if (!options_.adaptcache.enabled && free_dram_chunks() + dram_chunks_demoting_ < reserve) {
    const std::optional<ItemId> victim =
        choose_top_victim(options_.policy, all, queue_, eviction_window());
    // Never demote what the prefetcher just brought in for the jobs about to run.
    const bool protected_job = options_.policy == EvictionPolicy::kSchedulerAware && victim &&
                               first_position(*victim) < prefetch_window_length;
    if (victim && !protected_job) {
      if (claim) {
        Item& item = items_.at(*victim);
        item.busy = true;
        dram_chunks_demoting_ += item.held[kDramTier];
      }
      return {Action::kDemote, *victim};
    }
  }
  if (std::optional<ItemId> shared = write_through_candidate()) {
    if (claim) {
      Item& item = items_.at(*shared);
      item.busy = true;
      item.shared_written = std::ssize(item.chunks);
    }
    return {Action::kWriteThrough, *shared};
  }
  if (options_.policy == EvictionPolicy::kSchedulerAware) {
    // Head first, and only while the item fits beside what the jobs ahead of it still have to
    // read into DRAM: a prefetch must not take the room the next load needs.
    int64_t needed = 0;
    for (ItemId candidate : prefetch_candidates(all, queue_, prefetch_window_length)) {
      const Item& item = items_.at(candidate);
      needed += std::ssize(item.chunks) - item.held[kDramTier];
      if (needed > free_dram_chunks()) break;
      bool readable = true;
      for (const Chunk& c : item.chunks) readable = readable && (c.dram != nullptr || source_of(c) > 0);
      if (!readable) continue;
      if (claim) items_.at(candidate).busy = true;
      return {Action::kPrefetch, candidate};
    }
  }
  return {};
}

void KvStore::io_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    if (!commits_.empty()) {
      PendingCommit commit = std::move(commits_.back());
      commits_.pop_back();
      ++active_actions_;
      lock.unlock();
      const auto start = Clock::now();
      commit.wait();
      lock.lock();
      publish(commit.ticket, commit.write_seconds + seconds_since(start));
      --active_actions_;
      idle_.notify_all();
      continue;
    }
    if (stopping_) return;
    expire_items();
    const Decision decision = next_action(true);
    if (decision.action == Action::kNone) {
      idle_.notify_all();
      work_.wait_for(lock, std::chrono::seconds(1));
      continue;
    }
    if (decision.action == Action::kEvict) {  // no I/O: under the lock, before anything pins it
      evict(decision.item);
      continue;
    }
    ++active_actions_;
    lock.unlock();
    switch (decision.action) {
      case Action::kPrefetch:
        prefetch(decision.item);
        break;
      case Action::kDemote:
        demote(decision.item);
        break;
      case Action::kTranscode:
        transcode(decision.item, decision.codec);
        break;
      case Action::kWriteThrough:
        write_through(decision.item);
        break;
      case Action::kEvict:  // done under the lock, above
      case Action::kNone:
        break;
    }
    lock.lock();
    --active_actions_;
    idle_.notify_all();
  }
}

void KvStore::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] {
    return commits_.empty() && active_actions_ == 0 && next_action(false).action == Action::kNone;
  });
}

}  // namespace strata::store
