// The store's lossy codecs (store/item_codecs.h): which item to re-encode, demote or evict next
// (a fixed codec for every item, or AdaptCache's utility greedy over every item), the
// re-encoding itself on an I/O thread, and the reuse counts AdaptCache's utility weighs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <spdlog/spdlog.h>
#include <unordered_set>

#include "strata/common/check.h"
#include "strata/store/kv_store.h"

namespace strata::store {
namespace {

double seconds_between(std::chrono::steady_clock::time_point from,
                       std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

void KvStore::record_use(Item& item) {
  if (!options_.adaptcache.enabled) return;  // only AdaptCache's utility reads reuse counts
  const double now = seconds_between(started_, std::chrono::steady_clock::now());
  const double half_life = options_.adaptcache.half_life_seconds;
  if (item.reuse.count == 0) {
    // A new item starts at the mean count of the items it joins (the population prior).
    double sum = 0;
    int64_t n = 0;
    for (const auto& [id, other] : items_) {
      if (other.reuse.count == 0) continue;
      sum += adaptcache::decayed_count(other.reuse, now, half_life);
      ++n;
    }
    item.reuse = {std::max(1.0, n > 0 ? sum / static_cast<double>(n) : 1.0), now};
    return;
  }
  adaptcache::record_use(&item.reuse, now, half_life);
}

adaptcache::Profile KvStore::make_adaptcache_profile() const {
  const AdaptCacheOptions& ac = options_.adaptcache;
  adaptcache::Profile profile;
  for (TierIndex t = 0; t < num_tiers(); ++t) {
    // Bandwidths are listed DRAM first, then StoreOptions::tiers (some may have failed to open).
    size_t index = 0;
    for (size_t i = 0; i < options_.tiers.size(); ++i) {
      if (options_.tiers[i].name == tiers_[t]->name()) index = i + 1;
    }
    profile.tiers.push_back({tiers_[t]->name(), tiers_[t]->capacity_bytes(), ac.bandwidth[index],
                             ac.latency_seconds[index]});
  }
  for (const ItemCodec& c : options_.codecs) {
    const adaptcache::Method method = c.keep_fraction < 1  ? adaptcache::Method::kStreaming
                                      : c.merged_pairs > 0 ? adaptcache::Method::kLayerMerge
                                      : c.name == "none"   ? adaptcache::Method::kNone
                                                           : adaptcache::Method::kKivi;
    profile.codecs.push_back({c.name, method,
                              c.keep_fraction * static_cast<double>(c.chunk_bytes) /
                                  static_cast<double>(options_.chunk_bytes),
                              c.decode_seconds_per_byte});
  }
  // Task 0 is an item of no family (the codecs' quality), task t + 1 adaptcache.tasks[t].
  profile.tasks = {"default"};
  profile.tasks.insert(profile.tasks.end(), ac.tasks.begin(), ac.tasks.end());
  for (size_t t = 0; t < profile.tasks.size(); ++t) {
    std::vector<double>& row = profile.quality.emplace_back();
    for (const ItemCodec& c : options_.codecs) {
      // Codecs the profile leaves out are never options; their quality is not read.
      const double q = t == 0 || c.task_quality.empty() ? c.quality : c.task_quality[t - 1];
      row.push_back(std::clamp(q, 0.0, 1.0));
    }
  }
  profile.alpha = ac.alpha;
  return profile;
}

KvStore::Decision KvStore::codec_decision() {
  auto settled = [](const Item& item) {
    return !item.chunks.empty() && item.pins == 0 && !item.busy && item.pending.empty();
  };
  if (!options_.adaptcache.enabled) {
    if (options_.fixed_codec == 0) return {};
    for (const auto& [id, item] : items_) {
      if (item.codec == 0 && settled(item) && item.continued_saves == 0 &&
          item.held[kDramTier] == std::ssize(item.chunks) &&
          mergeable(item, options_.fixed_codec)) {
        return {Action::kTranscode, id, options_.fixed_codec};
      }
    }
    return {};
  }
  // Like demotion, only when DRAM is below its reserve.
  const auto reserve = static_cast<int64_t>(std::ceil(
      options_.dram_reserve_fraction * static_cast<double>(capacity_chunks(kDramTier))));
  if (free_dram_chunks() + dram_chunks_demoting_ >= reserve) return {};

  adaptcache::Profile profile = adaptcache_profile_;  // capacities are set below
  const double now = seconds_between(started_, std::chrono::steady_clock::now());
  // Composed with CachedAttention: an item whose job is about to run is not moved.
  std::unordered_set<ItemId> about_to_run;
  if (options_.policy == EvictionPolicy::kSchedulerAware) {
    const int64_t window = std::min<int64_t>(prefetch_window(), std::ssize(queue_));
    about_to_run.insert(queue_.begin(), queue_.begin() + window);
  }
  std::vector<adaptcache::Entry> entries;
  // Bytes the plan does not place: DRAM held by saves in flight and partly loaded items' other
  // copies, and lower tiers' copies of items that are (also) in DRAM.
  std::vector<int64_t> unplaced(tiers_.size(), 0);
  for (TierIndex t = 0; t < num_tiers(); ++t) unplaced[t] = tiers_[t]->used_bytes();
  for (const auto& [id, item] : items_) {
    const int64_t n = std::ssize(item.chunks);
    if (n == 0) continue;
    adaptcache::Entry e;
    e.id = id;
    e.raw_bytes = n * options_.chunk_bytes;
    for (size_t c = 0; c < options_.codecs.size(); ++c) {
      const ItemCodec& codec = options_.codecs[c];
      const int64_t chunks = std::min(n, kept_chunks(codec.keep_fraction, n + item.skipped_chunks));
      // Codecs the profile leaves out are not options (an item keeps the one it has), nor is a
      // layer merge for a conversation without its pairs, nor any other codec for an item a save
      // still grows (it may move between tiers meanwhile: a save larger than DRAM needs that).
      const bool offered = (codec.quality >= 0 && mergeable(item, static_cast<int32_t>(c)) &&
                            item.continued_saves == 0) ||
                           static_cast<int32_t>(c) == item.codec;
      e.codec_bytes.push_back(offered ? chunks * dram_->footprint(codec.chunk_bytes) : -1);
    }
    e.frequency = adaptcache::uses_per_second(item.reuse, now, options_.adaptcache.half_life_seconds);
    e.task = item.task;
    e.prefill_seconds = static_cast<double>(n * options_.block_size_tokens) *
                        options_.adaptcache.prefill_seconds_per_token;
    e.current.codec = item.codec;
    // The nearest tier holding it whole: a partial DRAM copy (some chunks loaded) cannot be
    // re-encoded, so such an item is placed where its whole copy is.
    e.current.tier = -1;
    for (TierIndex t = 0; t < num_tiers() && e.current.tier < 0; ++t) {
      if (usable(t) && item.held[t] == n) e.current.tier = t;
    }
    if (e.current.tier < 0) continue;  // not whole anywhere it can be read from
    e.pinned = !settled(item) || about_to_run.contains(id);
    unplaced[e.current.tier] -= e.codec_bytes[item.codec];
    entries.push_back(std::move(e));
  }
  for (TierIndex t = 0; t < num_tiers(); ++t) {
    // DRAM's reserve stays free for saves and prefetches, as the trigger above counts it.
    const int64_t kept = t == kDramTier ? reserve * dram_chunk_bytes() : 0;
    profile.tiers[t].capacity_bytes =
        std::max<int64_t>(0, tiers_[t]->capacity_bytes() - kept - std::max<int64_t>(0, unplaced[t]));
  }
  const adaptcache::Plan plan = adaptcache::place(profile, entries);
  if (plan.moves.empty()) return {};
  const adaptcache::Move& m = plan.moves.front();
  const Item& item = items_.at(m.id);
  if (m.to.tier == adaptcache::kEvicted) return {Action::kEvict, m.id};
  if (m.from.tier != kDramTier) return {};  // lower tiers only evict: nothing else to do now
  if (m.to.codec != item.codec) return {Action::kTranscode, m.id, m.to.codec};
  return {Action::kDemote, m.id};
}

bool KvStore::mergeable(const Item& item, int32_t codec) const {
  const ItemCodec& c = options_.codecs[codec];
  // A chunk written below as a suffix lacks its leading layers; a suffix not yet written stays
  // possible in a codec that keeps one.
  if (codec != 0 && (item.suffix_chunks || (item.suffix() && !keeps_suffix(codec)))) return false;
  if (c.heavy_hitters) return !item.token_mass.empty();
  return c.merged_pairs == 0 || std::ssize(item.layer_pairs) == c.merged_pairs;
}

void KvStore::set_layer_pairs(ItemId id, std::vector<kv::krul::LayerPair> pairs) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(id);
  if (it == items_.end() || options_.codecs[it->second.codec].merged_pairs > 0) return;
  it->second.layer_pairs = std::move(pairs);
  work_.notify_all();  // a fixed layer merge may apply now
}

void KvStore::set_token_mass(ItemId id, std::vector<float> mass) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(id);
  // Only a raw item takes an H2O codec (kept here outside the DRAM budget until it does).
  if (it == items_.end() || it->second.codec != 0) return;
  it->second.token_mass = std::move(mass);
  work_.notify_all();  // a fixed H2O codec may apply now
}

void KvStore::set_stored_layers(ItemId id, std::vector<int32_t> first_layers) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(id);
  if (it == items_.end() || !keeps_suffix(it->second.codec)) return;
  for (int32_t& layer : first_layers) layer = std::clamp(layer, 0, options_.chunk_layers - 1);
  if (std::ranges::all_of(first_layers, [](int32_t layer) { return layer == 0; })) {
    first_layers.clear();
  }
  it->second.stored_layers = std::move(first_layers);
}

void KvStore::evict(ItemId id) {
  Item& item = items_.at(id);
  for (TierIndex t = 0; t < num_tiers(); ++t) {
    if (item.held[t] > 0) {
      ++counters_[t].evictions;
      break;
    }
  }
  drop_item(id);
}

void KvStore::transcode(ItemId id, int32_t codec) {
  std::unique_lock lock(mutex_);
  Item& item = items_.at(id);
  const int32_t from = item.codec;
  const ItemCodec& to = options_.codecs[codec];
  // Token dropping keeps chunk 0 (the attention sinks) and the last kept - 1 chunks (the window)
  // as they are; a quantizing codec re-encodes every chunk; H2O reads every chunk and writes the
  // kept ones.
  const int64_t n = std::ssize(item.chunks);
  const int64_t kept = kept_chunks(to.keep_fraction, n + item.skipped_chunks);
  const int64_t dropped = n - std::min(n, kept);
  std::vector<const std::byte*> in;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || i > dropped || to.heavy_hitters) in.push_back(item.chunks[i].dram);
  }
  const std::vector<float> mass =
      to.heavy_hitters ? std::move(item.token_mass) : std::vector<float>();
  item.token_mass.clear();
  const bool whole = std::ranges::none_of(in, [](const std::byte* p) { return p == nullptr; });
  const std::vector<kv::krul::LayerPair> pairs = item.layer_pairs;
  const int64_t bytes = to.chunk_bytes;
  Status status = whole ? Status() : failed_precondition_error("not whole in DRAM");
  std::vector<AlignedBuffer> encoded;
  std::vector<std::byte*> out;
  if (status.ok()) {
    lock.unlock();  // the item is busy: its DRAM copy stays while the bytes are read
    for (int64_t i = 0; i < n - dropped; ++i) out.push_back(encoded.emplace_back(bytes).data());
    if (to.heavy_hitters && dropped > 0) {
      status = options_.keep_heavy_hitters(mass, in, out);
    } else if (to.keep_fraction < 1) {  // token dropping, or H2O keeping every token
      for (size_t i = 0; i < in.size(); ++i) std::memcpy(out[i], in[i], static_cast<size_t>(bytes));
    } else {
      status = options_.transcode(from, codec, pairs, in, out);
    }
    lock.lock();
  }
  Item& now = items_.at(id);
  now.busy = false;
  idle_.notify_all();
  if (!status.ok()) {
    // Left as it is, the same decision would come back at once: the item leaves the store.
    spdlog::warn("KV store: item {} not re-encoded to {} ({}); dropping it", id,
                 options_.codecs[codec].name, status.message());
    ++counters_[kDramTier].evictions;
    return drop_item(id);
  }
  // Every copy is in the old codec: the other tiers' are dropped, DRAM's replaced.
  for (TierIndex t = 0; t < num_tiers(); ++t) {
    if (now.held[t] == 0) continue;
    (void)tiers_[t]->evict(id);
    for (int64_t i = 0; i < std::ssize(now.chunks); ++i) set_held(now, i, t, false);
  }
  if (dropped > 0) {
    // The middle chunks leave; the kept ones keep their hashes (chunk i >= 1 now carries link
    // i + skipped_chunks). Their content index entries move to their new places, or to another
    // item carrying them with fewer chunks dropped; the dropped ones' to such an item, if any.
    std::vector<std::pair<kv::ChunkHash, int64_t>> links;
    for (int64_t i = 0; i < std::ssize(now.chunks); ++i) {
      links.emplace_back(now.chunks[i].hash, now.link(i));
    }
    now.chunks.erase(now.chunks.begin() + 1, now.chunks.begin() + 1 + dropped);
    published_chunks_ -= dropped;
    now.skipped_chunks += dropped;
    now.token_offset += dropped * options_.block_size_tokens;
    now.exact = false;
    if (now.content_indexed(options_.block_size_tokens)) reindex(id, links);
  }
  // H2O chose every kept chunk's tokens over all of them: only a match of them all is valid.
  if (to.heavy_hitters && dropped > 0) now.whole_chunks = std::ssize(now.chunks);
  std::optional<Reservation> room =
      dram_->reserve(std::vector<int64_t>(now.chunks.size(), bytes));
  if (!room) {  // the old copy's room went to a save meanwhile
    ++counters_[kDramTier].evictions;
    return drop_item(id);
  }
  --stats_.codec_items[now.codec];
  ++stats_.codec_items[codec];
  now.codec = codec;
  // A merge's values are those of the pairs it was given (a turn may have chosen others since).
  if (to.merged_pairs > 0) now.layer_pairs = pairs;
  std::vector<ChunkKey> keys;
  std::vector<std::span<const std::byte>> values;
  for (int64_t i = 0; i < std::ssize(now.chunks); ++i) {
    keys.push_back({id, static_cast<int32_t>(i), now.chunks[i].hash, 0});
    values.push_back(encoded[i].bytes());
  }
  STRATA_CHECK(dram_->put(now.record(options_), *room, keys, values).ok());
  for (int64_t i = 0; i < std::ssize(now.chunks); ++i) {
    now.chunks[i].dram = dram_->address(room->placements[i]);
    set_held(now, i, kDramTier, true);
  }
  ++stats_.transcodes;
  ++stats_.codec_transcodes[codec];
}

}  // namespace strata::store
