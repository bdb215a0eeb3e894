// The store's index and its step-thread operations: lookups, loads, saves. Background movement
// between tiers (demotion, prefetch, expiry, eviction) is in kv_store_io.cpp.
#include "strata/store/kv_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "strata/common/check.h"
#include "strata/kv/krul_policy.h"
#include "strata/kv/prefix_hash.h"

namespace strata::store {

const TierStats& StoreStats::tier(std::string_view name) const {
  for (const TierStats& t : tiers) {
    if (t.name == name) return t;
  }
  static const TierStats kAbsent = [] {
    TierStats absent;
    absent.available = false;
    return absent;
  }();
  return kAbsent;
}

int64_t KvStore::layer_offset(int32_t codec, std::span<const kv::krul::LayerPair> pairs,
                              int32_t layer) const {
  const ItemCodec& c = options_.codecs[codec];
  if (c.merged_pairs == 0) return layer * layer_bytes();
  const int64_t pair_bytes =
      (c.chunk_bytes - (options_.chunk_layers - c.merged_pairs) * layer_bytes()) / c.merged_pairs;
  return kv::krul::merged_layer_offset(pairs, layer, layer_bytes(), pair_bytes);
}

int64_t KvStore::suffix_offset(const Item& item, const Chunk& chunk) const {
  return chunk.first_layer == 0 ? 0 : layer_offset(item.codec, item.layer_pairs, chunk.first_layer);
}

bool KvStore::Item::only_in(TierIndex t) const {
  for (int u = 0; u < kMaxTiers; ++u) {
    if (u != t && held[u] > 0) return false;
  }
  return true;
}

KvStore::KvStore(const StoreOptions& options) : options_(options) {
  stats_.codec_items.assign(options_.codecs.size(), 0);
  stats_.codec_transcodes.assign(options_.codecs.size(), 0);
  for (const ItemCodec& c : options_.codecs) stats_.codec_names.push_back(c.name);
}

StatusOr<std::unique_ptr<KvStore>> KvStore::open(const StoreOptions& options) {
  StoreOptions with_none = options;
  with_none.codecs.insert(with_none.codecs.begin(),
                          {.name = "none", .chunk_bytes = options.chunk_bytes, .task_quality = {}});
  STRATA_RETURN_IF_ERROR(with_none.validate());
  std::unique_ptr<KvStore> store(new KvStore(with_none));
  STRATA_RETURN_IF_ERROR(store->start());
  return store;
}

Status KvStore::start() {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<DramTier> dram,
                          DramTier::open({options_.dram_bytes, options_.register_host_memory,
                                          options_.unregister_host_memory}));
  dram_ = dram.get();
  tiers_.push_back(std::move(dram));
  for (SsdOptions ssd : options_.tiers) {
    ssd.layout_tag = options_.layout_tag;
    if (ssd.codec == CodecKind::kIdentity) {
      ssd.segment_bytes = options_.chunk_bytes / options_.chunk_layers;  // read_layers' parts
    }
    std::vector<RecoveredItem> recovered;
    StatusOr<std::unique_ptr<SsdTier>> tier = SsdTier::open(ssd, &recovered);
    if (!tier.ok() && ssd.required) {
      return failed_precondition_error("KV store: the " + ssd.name + " tier at '" + ssd.dir +
                                       "' cannot be used: " + tier.status().message());
    }
    if (!tier.ok()) {
      spdlog::warn("KV store: no {} tier ({}); continuing without it", ssd.name,
                   tier.status().to_string());
      continue;
    }
    tiers_.push_back(std::move(tier).value());
    adopt(static_cast<TierIndex>(tiers_.size() - 1), std::move(recovered));
  }
  if (options_.remote) {
    RedisOptions remote = *options_.remote;
    remote.layout_tag = options_.layout_tag;
    StatusOr<std::unique_ptr<RedisTier>> tier = RedisTier::open(remote);
    if (!tier.ok()) {
      return failed_precondition_error("KV store: the " + remote.name + " tier at '" +
                                       remote.address + "' cannot be used: " +
                                       tier.status().message());
    }
    shared_tier_ = tier->get();
    tiers_.push_back(std::move(tier).value());
    shared_ = static_cast<TierIndex>(tiers_.size() - 1);
  }
  counters_.resize(tiers_.size());
  if (options_.adaptcache.enabled) adaptcache_profile_ = make_adaptcache_profile();
  for (int32_t i = 0; i < options_.io_threads; ++i) threads_.emplace_back([this] { io_loop(); });
  return Status();
}

KvStore::~KvStore() {
  {
    std::scoped_lock lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
  // Clean shutdown: persist what only DRAM holds, while the lower tiers have room.
  std::unique_lock lock(mutex_);
  int64_t saved = 0;
  for (auto& [id, item] : items_) {
    if (item.busy || !item.pending.empty() || !item.only_in(kDramTier)) continue;
    item.busy = true;
    bool ok = false;
    for (TierIndex t = 1; t < num_tiers(); ++t) ok = write_down(id, t, lock) || ok;
    items_.at(id).busy = false;
    saved += ok ? 1 : 0;
  }
  if (saved > 0) spdlog::info("KV store: {} conversations persisted below DRAM", saved);
}

std::vector<int32_t> KvStore::first_layers_of(const Item& item, int64_t first, int64_t count) {
  const auto begin = item.chunks.begin() + first, end = begin + count;
  if (std::none_of(begin, end, [](const Chunk& c) { return c.first_layer > 0; })) return {};
  std::vector<int32_t> layers;
  for (auto c = begin; c != end; ++c) layers.push_back(c->first_layer);
  return layers;
}

void KvStore::set_held(Item& item, int64_t index, TierIndex t, bool held) {
  Chunk& c = item.chunks[index];
  const uint32_t bit = 1u << t;
  if (((c.tiers & bit) != 0) == held) return;
  c.tiers ^= bit;
  const int64_t delta = held ? 1 : -1;
  item.held[t] += delta;
  tier_chunks_[t] += delta;
}

double KvStore::mean_item_chunks() const {
  return published_items_ == 0
             ? 0.0
             : static_cast<double>(published_chunks_) / static_cast<double>(published_items_);
}

std::optional<StoreMatch> KvStore::find(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                        const std::string& session) {
  std::scoped_lock lock(mutex_);
  std::optional<StoreMatch> best = match(prompt, root, session);
  if (!best) {
    for (TierCounters& c : counters_) ++c.misses;
  }
  return best;
}

std::optional<StoreMatch> KvStore::peek(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                        const std::string& session) const {
  std::scoped_lock lock(mutex_);
  return match(prompt, root, session);
}

int64_t KvStore::session_chunks_matching(
    std::span<const TokenId> prompt, const kv::ChunkHash& root, int64_t hash_offset,
    int64_t skipped_chunks, int64_t num_chunks,
    const std::function<kv::ChunkHash(int64_t)>& hash_of) const {
  const int64_t block = options_.block_size_tokens;
  const int64_t n = std::ssize(prompt);
  const int64_t d = hash_offset;
  auto link = [&](int64_t i) { return i == 0 ? 0 : i + skipped_chunks; };
  // Links whose tokens end before the prompt's last token.
  const int64_t links = n > d ? (n - d - 1) / block : 0;
  int64_t last = num_chunks - 1;
  while (last >= 0 && link(last) >= links) --last;
  if (last < 0) return 0;
  std::vector<kv::ChunkHash> chain;
  kv::ChunkHash h = root;
  for (int64_t j = 0; j <= link(last); ++j) {
    h = kv::chain_hash(h, prompt.subspan(j * block + (j > 0 ? d : 0), block));
    chain.push_back(h);
  }
  // A link's hash covers every link before it: the last chunk that matches has every earlier
  // one matching too.
  for (int64_t i = last; i >= 0; --i) {
    if (hash_of(i) == chain[link(i)]) return i + 1;
  }
  return 0;
}

std::optional<StoreMatch> KvStore::match(std::span<const TokenId> prompt,
                                         const kv::ChunkHash& root,
                                         const std::string& session) const {
  const int64_t block = options_.block_size_tokens;
  const int64_t n = std::ssize(prompt);
  // The leading `chunks` of `item` a load can read (none held only by a failed tier), and the
  // farthest tier it would read them from; nullopt when not even the first is readable, or not
  // all of its whole chunks.
  auto match_of = [&](const Item& item, int64_t chunks) -> std::optional<StoreMatch> {
    StoreMatch m{item.id,          0, item.token_offset, item.exact, item.skipped_chunks, kDramTier,
                 item.whole_chunks};
    for (; m.num_chunks < chunks; ++m.num_chunks) {
      const Chunk& c = item.chunks[m.num_chunks];
      if (c.dram != nullptr) continue;
      const TierIndex t = source_of(c);
      if (t < 0) break;
      m.tier = std::max(m.tier, t);
    }
    if (m.num_chunks == 0 || m.num_chunks < item.whole_chunks) return std::nullopt;
    return m;
  };
  if (!session.empty()) {
    if (auto it = by_session_.find(session); it != by_session_.end()) {
      const Item& item = items_.at(it->second);
      const int64_t matched = session_chunks_matching(
          prompt, root, item.hash_offset(block), item.skipped_chunks, std::ssize(item.chunks),
          [&](int64_t i) { return item.chunks[i].hash; });
      if (std::optional<StoreMatch> m = match_of(item, matched)) return m;
    }
  }
  // By content: the furthest link of the prompt's chain a stored chunk carries. Its item's
  // earlier chunks carry earlier links of the same chain (a token-dropped item skips some), so
  // they match too.
  std::vector<kv::ChunkHash> chain;
  kv::ChunkHash h = root;
  for (int64_t i = 0; i < (n - 1) / block; ++i) {
    h = kv::chain_hash(h, prompt.subspan(i * block, block));
    chain.push_back(h);
  }
  for (int64_t i = std::ssize(chain) - 1; i >= 0; --i) {
    auto it = by_hash_.find(chain[i]);
    if (it == by_hash_.end()) continue;
    auto item = items_.find(it->second.first);
    const int32_t index = it->second.second;
    if (item == items_.end() || std::ssize(item->second.chunks) <= index ||
        item->second.chunks[index].hash != chain[i] || item->second.link(index) != i) {
      continue;  // a stale entry: its item was dropped or replaced
    }
    if (std::optional<StoreMatch> m = match_of(item->second, index + 1)) return m;
  }
  return std::nullopt;
}

StatusOr<KvStore::Item*> KvStore::leasable(ItemId id, int64_t end, int64_t skipped_chunks,
                                           std::unique_lock<std::mutex>& lock) {
  idle_.wait(lock, [&] { return !items_.contains(id) || !items_.at(id).busy; });
  auto it = items_.find(id);
  if (it == items_.end() || !it->second.serves(end, skipped_chunks)) {
    for (TierCounters& c : counters_) ++c.misses;
    const bool renumbered =
        it != items_.end() && !it->second.doomed && !it->second.same_chunks(end, skipped_chunks);
    return not_found_error("KV store: conversation item " + std::to_string(id) +
                           (renumbered ? " dropped chunks (token dropping) since it was matched"
                                       : " is no longer stored"));
  }
  return &it->second;
}

StatusOr<StoreLease> KvStore::acquire(ItemId id, int64_t first, int64_t count,
                                      int64_t skipped_chunks) {
  std::unique_lock lock(mutex_);
  STRATA_ASSIGN_OR_RETURN(Item * found, leasable(id, first + count, skipped_chunks, lock));
  Item& item = *found;
  int64_t missing = 0;  // chunks only below DRAM
  for (int64_t i = first; i < first + count; ++i) missing += item.chunks[i].dram == nullptr;
  StoreLease lease{id, {}, kDramTier, item.codec, {}, nullptr, {}};
  if (missing > 0) {
    ++item.pins;  // not a reclaim victim itself
    const bool room = reclaim_clean_dram(missing);
    --item.pins;
    if (!room) lease.direct = std::make_shared<std::vector<AlignedBuffer>>();
    item.busy = true;
    const Status fetched = fetch(id, first, count, lease.direct.get(), &lease.served_from, lock);
    if (!fetched.ok()) return fetched;
    ++counters_[lease.served_from].hits;
    ++counters_[kDramTier].misses;
    if (!room) ++stats_.direct_loads;
  } else {
    ++counters_[item.fetched_from].hits;
    lease.served_from = item.fetched_from;
  }
  Item& now = items_.at(id);
  now.fetched_from = kDramTier;  // reported once, by the load it was read for
  if (options_.codecs[now.codec].merged_pairs > 0) lease.layer_pairs = now.layer_pairs;
  ++now.pins;
  touch(now);
  record_use(now);
  for (int64_t i = first; i < first + count; ++i) {
    const std::byte* dram = now.chunks[i].dram;
    lease.chunks.push_back(dram != nullptr ? dram : (*lease.direct)[i - first].data());
  }
  lease.first_layers = first_layers_of(now, first, count);
  return lease;
}

std::optional<StoreLease> KvStore::try_acquire_in_dram(ItemId id, int64_t first, int64_t count,
                                                       int64_t skipped_chunks) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(id);
  if (it == items_.end()) return std::nullopt;
  Item& item = it->second;
  // The read buffer holds raw layers: encoded items are loaded with their pass, and so are
  // stored suffixes (only their restoration's plan knows which layers a load may read).
  if (item.busy || item.codec != 0 || !item.serves(first + count, skipped_chunks) ||
      !first_layers_of(item, first, count).empty()) {
    return std::nullopt;
  }
  StoreLease lease{id, {}, kDramTier, item.codec, {}, nullptr, {}};
  for (int64_t i = first; i < first + count; ++i) {
    if (item.chunks[i].dram == nullptr) return std::nullopt;
    lease.chunks.push_back(item.chunks[i].dram);
  }
  ++item.pins;
  ++counters_[item.fetched_from].hits;
  lease.served_from = std::exchange(item.fetched_from, kDramTier);
  touch(item);
  record_use(item);
  return lease;
}

std::optional<TierIndex> KvStore::locate(ItemId id, int64_t first, int64_t count,
                                         int64_t skipped_chunks, std::vector<int32_t>* first_layers,
                                         std::vector<kv::krul::LayerPair>* layer_pairs) const {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(id);
  if (it == items_.end() || !it->second.serves(first + count, skipped_chunks)) return std::nullopt;
  const Item& item = it->second;
  if (first_layers != nullptr) *first_layers = first_layers_of(item, first, count);
  if (layer_pairs != nullptr) {
    layer_pairs->clear();
    if (options_.codecs[item.codec].merged_pairs > 0) *layer_pairs = item.layer_pairs;
  }
  TierIndex farthest = item.fetched_from;
  for (int64_t i = first; i < first + count; ++i) {
    if (item.chunks[i].dram == nullptr) farthest = std::max(farthest, source_of(item.chunks[i]));
  }
  return farthest;
}

void KvStore::release(const StoreLease& lease, double load_seconds) {
  {
    std::scoped_lock lock(mutex_);
    auto it = items_.find(lease.item);
    STRATA_CHECK(it != items_.end() && it->second.pins > 0) << "release of an unpinned item";
    if (--it->second.pins == 0 && it->second.doomed) drop_item(lease.item);
    const int64_t direct =
        lease.direct ? std::ranges::count_if(*lease.direct, [](const AlignedBuffer& b) {
          return b.data() != nullptr;
        })
                     : 0;
    TierCounters& dram = counters_[kDramTier];
    dram.bytes_out += (std::ssize(lease.chunks) - direct) * options_.codecs[lease.codec].chunk_bytes;
    dram.load_seconds += load_seconds;
    ++dram.loads;
  }
  work_.notify_all();
}

StatusOr<SaveTicket> KvStore::begin_save(const SaveRequest& request) {
  std::scoped_lock lock(mutex_);
  auto is_prefix = [&](const Item& item) {
    if (item.chunks.size() > request.chain.size()) return false;
    for (size_t i = 0; i < item.chunks.size(); ++i) {
      if (item.chunks[i].hash != request.chain[i]) return false;
    }
    return true;
  };
  // Encoded chunks and the raw ones the device writes do not mix in one item; an item another
  // save is still growing (continue_save) is left to it.
  auto extendable = [&](const Item& item) {
    return !item.busy && item.pending.empty() && item.continued_saves == 0 && item.codec == 0 &&
           item.exact == request.exact && item.token_offset == request.token_offset &&
           item.skipped_chunks == request.skipped_chunks &&
           item.whole_chunks == request.whole_chunks &&
           (item.session.empty() || item.session == request.session) && is_prefix(item);
  };
  Item* target = nullptr;
  std::optional<ItemId> replaced;  // the session's previous item, when not extended
  if (!request.session.empty()) {
    if (auto it = by_session_.find(request.session); it != by_session_.end()) {
      Item& item = items_.at(it->second);
      if (extendable(item)) {
        target = &item;
      } else {
        replaced = item.id;
      }
    }
  }
  const bool by_content =
      request.token_offset == request.skipped_chunks * options_.block_size_tokens;
  if (target == nullptr && by_content) {
    for (size_t j = request.chain.size(); j-- > 0 && target == nullptr;) {
      auto it = by_hash_.find(request.chain[j]);
      if (it == by_hash_.end()) continue;
      auto item = items_.find(it->second.first);
      if (item != items_.end() && item->second.chunks.size() == j + 1 && extendable(item->second)) {
        target = &item->second;
      }
    }
  }
  const int64_t first = target ? std::ssize(target->chunks) : 0;
  int64_t count = std::ssize(request.chain) - first;
  SaveTicket ticket{target ? target->id : 0, first, {}, {}};
  STRATA_CHECK(request.task >= 0 && request.task <= std::ssize(options_.adaptcache.tasks))
      << "task " << request.task;
  if (count <= 0) {
    if (target) {
      target->task = request.task;  // the latest request's family, even when it adds nothing
      touch(*target);
    }
    return ticket;
  }
  if (free_dram_chunks() < count) reclaim_clean_dram(count);
  if (free_dram_chunks() == 0) {
    ++stats_.saves_skipped;
    work_.notify_all();
    return resource_exhausted_error("KV store: no DRAM room for " + std::to_string(count) +
                                    " chunks now");
  }
  if (free_dram_chunks() < count) {
    // The leading chunks are worth keeping: a later turn loads them and extends the item.
    count = free_dram_chunks();
    ++stats_.saves_partial;
    work_.notify_all();
  }
  if (target == nullptr) {
    Item item;
    item.id = next_item_++;
    item.session = request.session;
    item.exact = request.exact;
    item.token_offset = request.token_offset;
    item.skipped_chunks = request.skipped_chunks;
    item.whole_chunks = request.whole_chunks;
    item.stored_at = ++clock_;
    ticket.item = item.id;
    target = &items_.emplace(item.id, std::move(item)).first->second;
    ++stats_.codec_items[0];
  }
  if (replaced && *replaced != target->id) {
    Item& old = items_.at(*replaced);
    // An exact raw item stays findable by content; a truncated or encoded one is superseded by
    // the new item's chunks and reachable only by its session.
    if ((!old.exact || old.codec != 0) && old.pins == 0 && !old.busy && old.pending.empty()) {
      drop_item(*replaced);
    } else {
      old.session.clear();
    }
  }
  if (!request.session.empty()) {
    target->session = request.session;
    by_session_[request.session] = target->id;
  }
  target->task = request.task;  // the latest request's family
  target->pending.assign(request.chain.begin() + first, request.chain.begin() + first + count);
  touch(*target);
  const std::vector<int64_t> sizes(static_cast<size_t>(count), options_.chunk_bytes);
  ticket.reservation = dram_->reserve(sizes).value();  // room was checked
  for (const Placement& p : ticket.reservation.placements) {
    ticket.destinations.push_back(dram_->address(p));
  }
  return ticket;
}

int64_t KvStore::extend_save(SaveTicket* ticket, std::span<const kv::ChunkHash> hashes) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(ticket->item);
  if (it == items_.end() || it->second.doomed || hashes.empty()) return 0;
  Item& item = it->second;
  // (An item re-encoded meanwhile takes no raw chunks.)
  if (ticket->destinations.empty() && (item.busy || item.codec != 0 || !item.pending.empty() ||
                                       std::ssize(item.chunks) != ticket->first_chunk)) {
    return 0;
  }
  const auto wanted = std::ssize(hashes);
  if (free_dram_chunks() < wanted) reclaim_clean_dram(wanted);
  const int64_t count = std::min(wanted, free_dram_chunks());
  if (count < wanted) {
    ++(count == 0 ? stats_.saves_skipped : stats_.saves_partial);
    work_.notify_all();
  }
  if (count == 0) return 0;
  const std::vector<int64_t> sizes(static_cast<size_t>(count), options_.chunk_bytes);
  const Reservation more = dram_->reserve(sizes).value();  // room was checked
  for (int64_t i = 0; i < count; ++i) {
    item.pending.push_back(hashes[i]);
    ticket->reservation.placements.push_back(more.placements[i]);
    ticket->destinations.push_back(dram_->address(more.placements[i]));
  }
  touch(item);
  return count;
}

void KvStore::publish(const SaveTicket& ticket, double write_seconds) {
  Item& item = items_.at(ticket.item);
  if (item.doomed) {  // dropped while the save wrote (a failed read of its chunks)
    dram_->cancel(ticket.reservation);
    item.pending.clear();
    drop_item(item.id);
    return;
  }
  const int64_t n = std::ssize(ticket.destinations);
  published_chunks_ += n;
  published_items_ += item.chunks.empty() && n > 0 ? 1 : 0;
  std::vector<ChunkKey> keys;
  std::vector<std::span<const std::byte>> values;  // in place: the device wrote them
  for (int64_t i = 0; i < n; ++i) {
    const auto index = static_cast<int32_t>(item.chunks.size());
    keys.push_back({item.id, index, item.pending[i], 0});
    values.emplace_back(ticket.destinations[i], static_cast<size_t>(options_.chunk_bytes));
    item.chunks.push_back({item.pending[i], 0, ticket.destinations[i]});
    set_held(item, index, kDramTier, true);
    if (item.content_indexed(options_.block_size_tokens)) index_chunk(item, index);
  }
  STRATA_CHECK(dram_->put(item.record(options_), ticket.reservation, keys, values).ok());
  item.pending.clear();
  record_use(item);
  TierCounters& dram = counters_[kDramTier];
  dram.bytes_in += n * options_.chunk_bytes;
  dram.save_seconds += write_seconds;
  ++dram.saves;
  publications_.fetch_add(1, std::memory_order_relaxed);
  touch(item);
  // Its session ended while the save ran: truncated history is reachable by session only.
  if (!item.content_indexed(options_.block_size_tokens) && item.session.empty()) drop_item(item.id);
}

void KvStore::index_chunk(const Item& item, int64_t index) {
  const kv::ChunkHash& hash = item.chunks[index].hash;
  auto [entry, added] = by_hash_.try_emplace(hash, item.id, static_cast<int32_t>(index));
  if (added || entry->second.first == item.id) {
    entry->second.second = static_cast<int32_t>(index);
    return;
  }
  auto owner = items_.find(entry->second.first);
  const int32_t at = entry->second.second;
  const bool keep =
      owner != items_.end() && !owner->second.doomed &&
      owner->second.skipped_chunks < item.skipped_chunks && at < std::ssize(owner->second.chunks) &&
      owner->second.chunks[at].hash == hash && owner->second.link(at) == item.link(index);
  if (!keep) entry->second = {item.id, static_cast<int32_t>(index)};
}

void KvStore::reindex(ItemId id, std::span<const std::pair<kv::ChunkHash, int64_t>> links) {
  std::unordered_map<kv::ChunkHash, int64_t> wanted;  // hash -> link
  for (const auto& [hash, link] : links) {
    auto entry = by_hash_.find(hash);
    if (entry == by_hash_.end() || entry->second.first == id) wanted.emplace(hash, link);
  }
  struct Owner {
    ItemId id = 0;
    int32_t index = 0;
    int64_t skipped = 0;
  };
  std::unordered_map<kv::ChunkHash, Owner> best;
  for (const auto& [other_id, other] : items_) {
    if (other.doomed || !other.content_indexed(options_.block_size_tokens)) continue;
    for (int64_t j = 0; j < std::ssize(other.chunks); ++j) {
      auto w = wanted.find(other.chunks[j].hash);
      if (w == wanted.end() || other.link(j) != w->second) continue;
      const Owner candidate{other_id, static_cast<int32_t>(j), other.skipped_chunks};
      auto [b, added] = best.try_emplace(w->first, candidate);
      if (!added && candidate.skipped < b->second.skipped) b->second = candidate;
    }
  }
  for (const auto& [hash, link] : wanted) {
    auto b = best.find(hash);
    if (b == best.end()) {
      by_hash_.erase(hash);
    } else {
      by_hash_[hash] = {b->second.id, b->second.index};
    }
  }
}

void KvStore::commit_save(SaveTicket ticket, std::function<void()> wait, double write_seconds) {
  {
    std::scoped_lock lock(mutex_);
    end_continuation(ticket);
    if (!ticket.destinations.empty()) {
      queue_publication(std::move(ticket), std::move(wait), write_seconds);
    }
  }
  work_.notify_all();
}

SaveTicket KvStore::continue_save(SaveTicket ticket, std::function<void()> wait,
                                  double write_seconds) {
  SaveTicket next{ticket.item, ticket.first_chunk + std::ssize(ticket.destinations), {}, {}, true};
  {
    std::scoped_lock lock(mutex_);
    end_continuation(ticket);
    if (auto it = items_.find(ticket.item); it != items_.end()) ++it->second.continued_saves;
    if (!ticket.destinations.empty()) {
      queue_publication(std::move(ticket), std::move(wait), write_seconds);
    }
  }
  work_.notify_all();
  return next;
}

void KvStore::queue_publication(SaveTicket ticket, std::function<void()> wait,
                                double write_seconds) {
  if (wait) {
    commits_.push_back({std::move(ticket), std::move(wait), write_seconds});
  } else {
    publish(ticket, write_seconds);
  }
}

void KvStore::end_continuation(const SaveTicket& ticket) {
  if (!ticket.continued) return;
  // (The item may have been dropped meanwhile; ids are never reused.)
  if (auto it = items_.find(ticket.item); it != items_.end()) --it->second.continued_saves;
}

void KvStore::abort_save(const SaveTicket& ticket) {
  {
    std::scoped_lock lock(mutex_);
    end_continuation(ticket);
    if (!ticket.destinations.empty()) {
      dram_->cancel(ticket.reservation);
      Item& item = items_.at(ticket.item);
      item.pending.clear();
      if (item.chunks.empty() || item.doomed) drop_item(item.id);
    }
  }
  work_.notify_all();  // its item may be re-encoded now
}

void KvStore::set_queue(std::vector<ItemId> queue) {
  {
    std::scoped_lock lock(mutex_);
    queue_ = std::move(queue);
  }
  work_.notify_all();
}

bool KvStore::erase_session(const std::string& session) {
  // Other replicas forget it too (copies found by content stay, as here).
  const bool shared = shared_tier_ != nullptr && usable(shared_) &&
                      shared_tier_->erase_session(session).ok();
  std::unique_lock lock(mutex_);
  auto it = by_session_.find(session);
  if (it == by_session_.end()) return shared;
  const ItemId id = it->second;
  by_session_.erase(it);
  idle_.wait(lock, [&] { return !items_.contains(id) || !items_.at(id).busy; });
  auto item = items_.find(id);
  if (item == items_.end()) return true;
  if (item->second.pins == 0 && item->second.pending.empty()) {
    drop_item(id);
  } else {
    item->second.session.clear();
  }
  return true;
}

StoreStats KvStore::stats() const {
  std::scoped_lock lock(mutex_);
  StoreStats s = stats_;
  s.items = std::ssize(items_);
  for (TierIndex t = 0; t < num_tiers(); ++t) {
    TierStats& ts = s.tiers.emplace_back();
    static_cast<TierCounters&>(ts) = counters_[t];
    ts.name = tiers_[t]->name();
    ts.codec = codec_name(tiers_[t]->codec());
    ts.chunks = tier_chunks_[t];
    ts.used_bytes = tiers_[t]->used_bytes();
    ts.capacity_bytes = tiers_[t]->capacity_bytes();
    ts.raw_bytes = tier_chunks_[t] * options_.chunk_bytes;
    ts.available = tiers_[t]->healthy();
    ts.failures = tiers_[t]->failures();
  }
  return s;
}

}  // namespace strata::store
