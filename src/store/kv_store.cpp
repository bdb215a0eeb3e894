#include "strata/store/kv_store.h"

#include <sys/mman.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <spdlog/spdlog.h>

#include "strata/common/check.h"
#include "strata/kv/prefix_hash.h"
#include "strata/store/ssd_tier.h"

namespace strata::store {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

const char* tier_name(Tier tier) { return tier == Tier::kDram ? "dram" : "ssd"; }

Status StoreOptions::validate() const {
  if (chunk_bytes <= 0) return invalid_argument_error("store: chunk size must be positive");
  if (block_size_tokens <= 0) return invalid_argument_error("store: block size must be positive");
  const int64_t slot = round_up(chunk_bytes, kIoAlignment);
  if (dram_bytes < slot) {
    return invalid_argument_error("store.dram_bytes must hold at least one chunk (" +
                                  std::to_string(slot) + " bytes), got " + std::to_string(dram_bytes));
  }
  if (ssd_bytes < 0) return invalid_argument_error("store.ssd_bytes must be >= 0");
  if (ssd_bytes > 0 && ssd_dir.empty()) {
    return invalid_argument_error("store.ssd_dir must be set when store.ssd_bytes > 0");
  }
  if (!(dram_reserve_fraction >= 0 && dram_reserve_fraction <= 0.9)) {
    return invalid_argument_error("store.dram_reserve_fraction must be in [0, 0.9], got " +
                                  std::to_string(dram_reserve_fraction));
  }
  if (io_threads < 1) return invalid_argument_error("store.io_threads must be >= 1");
  if (ttl.count() < 0) return invalid_argument_error("store.ttl_seconds must be >= 0");
  return Status();
}

KvStore::KvStore(const StoreOptions& options) : options_(options) {}

StatusOr<std::unique_ptr<KvStore>> KvStore::open(const StoreOptions& options) {
  STRATA_RETURN_IF_ERROR(options.validate());
  std::unique_ptr<KvStore> store(new KvStore(options));
  STRATA_RETURN_IF_ERROR(store->start());
  return store;
}

Status KvStore::start() {
  slot_bytes_ = round_up(options_.chunk_bytes, kIoAlignment);
  const int64_t slots = options_.dram_bytes / slot_bytes_;
  if (slots > INT32_MAX) return invalid_argument_error("store.dram_bytes: too many chunks");
  arena_bytes_ = slots * slot_bytes_;
  void* arena = ::mmap(nullptr, static_cast<size_t>(arena_bytes_), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (arena == MAP_FAILED) {
    return resource_exhausted_error("store: cannot map " + std::to_string(arena_bytes_ >> 20) +
                                    " MiB of DRAM");
  }
  arena_ = static_cast<std::byte*>(arena);
  if (options_.register_host_memory) options_.register_host_memory(arena_, static_cast<size_t>(arena_bytes_));
  for (int64_t s = slots - 1; s >= 0; --s) free_dram_.push_back(static_cast<int32_t>(s));

  if (options_.ssd_bytes > 0) {
    SsdOptions ssd;
    ssd.dir = options_.ssd_dir;
    ssd.capacity_bytes = options_.ssd_bytes;
    ssd.file_bytes = std::max(slot_bytes_, options_.ssd_file_bytes / slot_bytes_ * slot_bytes_);
    ssd.slot_bytes = slot_bytes_;
    ssd.layout_tag = options_.layout_tag;
    ssd.direct_io = options_.direct_io;
    std::vector<RecoveredItem> recovered;
    StatusOr<std::unique_ptr<SsdTier>> tier = SsdTier::open(ssd, &recovered);
    if (!tier.ok()) {
      spdlog::warn("KV store: no SSD tier ({}); keeping conversations in DRAM only",
                   tier.status().to_string());
    } else {
      ssd_ = std::move(tier).value();
      for (RecoveredItem& r : recovered) {
        Item item;
        item.id = r.id;
        item.session = r.attributes.session;
        item.exact = r.attributes.exact;
        item.token_offset = r.attributes.token_offset;
        for (const ChunkRecord& c : r.chunks) {
          item.chunks.push_back({c.hash, -1, c.slot, c.checksum});
          if (item.exact) by_hash_[c.hash] = {r.id, c.chunk_index};
        }
        item.ssd_chunks = static_cast<int64_t>(item.chunks.size());
        if (!item.chunks.empty()) count_chunks(static_cast<int64_t>(item.chunks.size()), 1);
        item.stored_at = item.last_access = ++clock_;
        item.touched = Clock::now();
        if (!item.session.empty()) by_session_[item.session] = r.id;
        next_item_ = std::max(next_item_, r.id + 1);
        items_.emplace(r.id, std::move(item));
      }
      if (!recovered.empty()) {
        spdlog::info("KV store: recovered {} conversations from {}", recovered.size(),
                     options_.ssd_dir);
      }
    }
  }
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
  // Clean shutdown: persist what only DRAM holds, while the SSD has free room.
  std::unique_lock lock(mutex_);
  if (ssd_usable()) {
    int64_t saved = 0;
    for (auto& [id, item] : items_) {
      if (item.busy || !item.pending.empty()) continue;
      item.busy = true;
      const bool ok = write_to_ssd(id, lock);
      items_.at(id).busy = false;
      if (!ok) break;
      ++saved;
    }
    if (saved > 0) spdlog::info("KV store: {} conversations persisted to SSD", saved);
  }
  lock.unlock();
  ssd_.reset();
  if (options_.unregister_host_memory) options_.unregister_host_memory(arena_);
  ::munmap(arena_, static_cast<size_t>(arena_bytes_));
}

double KvStore::mean_item_chunks() const {
  return published_items_ == 0
             ? 0.0
             : static_cast<double>(published_chunks_) / static_cast<double>(published_items_);
}

void KvStore::count_chunks(int64_t chunks, int64_t items) {
  published_chunks_ += chunks;
  published_items_ += items;
}

int64_t KvStore::eviction_window() const {
  const int64_t capacity = dram_slots_total() + (ssd_usable() ? ssd_->num_slots() : 0);
  return window_length(capacity, mean_item_chunks(), static_cast<int64_t>(queue_.size()));
}

int64_t KvStore::prefetch_window() const {
  return window_length(dram_slots_total(), mean_item_chunks(), static_cast<int64_t>(queue_.size()));
}

std::vector<ItemView> KvStore::views() const {
  std::vector<ItemView> out;
  out.reserve(items_.size());
  for (const auto& [id, item] : items_) {
    ItemView v;
    v.id = id;
    v.num_chunks = static_cast<int64_t>(item.chunks.size());
    v.in_dram = item.dram_chunks > 0;
    v.on_ssd = item.ssd_chunks > 0;
    v.needs_fetch = v.on_ssd && item.dram_chunks < v.num_chunks;
    v.pinned = item.pins > 0 || item.busy || !item.pending.empty();
    v.last_access = item.last_access;
    v.stored_at = item.stored_at;
    out.push_back(v);
  }
  return out;
}

std::optional<StoreMatch> KvStore::find(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                                        const std::string& session) {
  const int64_t block = options_.block_size_tokens;
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::scoped_lock lock(mutex_);
  auto match_of = [&](const Item& item, int64_t chunks) {
    StoreMatch m{item.id, chunks, item.token_offset, item.exact, Tier::kDram};
    for (int64_t i = 0; i < chunks; ++i) {
      if (item.chunks[i].dram_slot < 0) m.tier = Tier::kSsd;
    }
    return m;
  };
  if (!session.empty()) {
    if (auto it = by_session_.find(session); it != by_session_.end()) {
      const Item& item = items_.at(it->second);
      const int64_t d = item.token_offset;
      const int64_t max_chunks = std::min<int64_t>(
          n > d ? (n - d - 1) / block : 0, static_cast<int64_t>(item.chunks.size()));
      kv::ChunkHash h = root;
      int64_t matched = 0;
      for (; matched < max_chunks; ++matched) {
        const int64_t start = matched * block + (matched > 0 ? d : 0);
        h = kv::chain_hash(h, prompt.subspan(start, block));
        if (h != item.chunks[matched].hash) break;
      }
      if (matched > 0) return match_of(item, matched);
    }
  }
  std::optional<StoreMatch> best;
  kv::ChunkHash h = root;
  for (int64_t i = 0; i < (n - 1) / block; ++i) {
    h = kv::chain_hash(h, prompt.subspan(i * block, block));
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    auto item = items_.find(it->second.first);
    const int32_t index = it->second.second;
    if (item == items_.end() || index != i ||
        static_cast<int64_t>(item->second.chunks.size()) <= index ||
        item->second.chunks[index].hash != h) {
      break;  // a stale entry: its item was dropped or replaced
    }
    best = match_of(item->second, i + 1);
  }
  if (!best) {
    ++stats_.dram.misses;
    ++stats_.ssd.misses;
  }
  return best;
}

StatusOr<StoreLease> KvStore::acquire(ItemId id, int64_t first, int64_t count) {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return !items_.contains(id) || !items_.at(id).busy; });
  auto it = items_.find(id);
  if (it == items_.end() || it->second.doomed ||
      static_cast<int64_t>(it->second.chunks.size()) < first + count) {
    ++stats_.dram.misses;
    ++stats_.ssd.misses;
    return not_found_error("KV store: conversation item " + std::to_string(id) +
                           " is no longer stored");
  }
  Item& item = it->second;
  int64_t missing = 0;  // chunks only on SSD
  for (int64_t i = first; i < first + count; ++i) missing += item.chunks[i].dram_slot < 0;
  StoreLease lease{id, {}, Tier::kDram};
  if (missing > 0) {
    ++item.pins;  // not a reclaim victim itself
    const bool room = reclaim_clean_dram(missing);
    --item.pins;
    if (!room) {
      work_.notify_all();
      ++stats_.dram.misses;
      return Status(StatusCode::kUnavailable, "KV store: no DRAM room to load item " +
                                                  std::to_string(id) + " from SSD now");
    }
    item.busy = true;
    const Status fetched = fetch_from_ssd(id, first, count, lock);
    if (!fetched.ok()) {
      ++stats_.ssd.misses;
      return fetched;
    }
    ++stats_.ssd.hits;
    ++stats_.dram.misses;
    lease.served_from = Tier::kSsd;
  } else {
    ++stats_.dram.hits;
  }
  Item& item_now = items_.at(id);
  ++item_now.pins;
  touch(item_now);
  for (int64_t i = first; i < first + count; ++i) {
    lease.chunks.push_back(dram(item_now.chunks[i].dram_slot));
  }
  return lease;
}

std::optional<StoreLease> KvStore::try_acquire_in_dram(ItemId id, int64_t first, int64_t count) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(id);
  if (it == items_.end()) return std::nullopt;
  Item& item = it->second;
  if (item.doomed || item.busy || static_cast<int64_t>(item.chunks.size()) < first + count) {
    return std::nullopt;
  }
  StoreLease lease{id, {}, Tier::kDram};
  for (int64_t i = first; i < first + count; ++i) {
    if (item.chunks[i].dram_slot < 0) return std::nullopt;
    lease.chunks.push_back(dram(item.chunks[i].dram_slot));
  }
  ++item.pins;
  ++stats_.dram.hits;
  touch(item);
  return lease;
}

void KvStore::release(const StoreLease& lease, double load_seconds) {
  {
    std::scoped_lock lock(mutex_);
    auto it = items_.find(lease.item);
    STRATA_CHECK(it != items_.end() && it->second.pins > 0) << "release of an unpinned item";
    if (--it->second.pins == 0 && it->second.doomed) drop_item(lease.item);
    stats_.dram.bytes_out += static_cast<int64_t>(lease.chunks.size()) * options_.chunk_bytes;
    stats_.dram.load_seconds += load_seconds;
    ++stats_.dram.loads;
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
  auto extendable = [&](const Item& item) {
    return !item.busy && item.pending.empty() && item.exact == request.exact &&
           item.token_offset == request.token_offset &&
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
  if (target == nullptr && request.exact) {
    for (size_t j = request.chain.size(); j-- > 0 && target == nullptr;) {
      auto it = by_hash_.find(request.chain[j]);
      if (it == by_hash_.end()) continue;
      auto item = items_.find(it->second.first);
      if (item != items_.end() && item->second.chunks.size() == j + 1 && extendable(item->second)) {
        target = &item->second;
      }
    }
  }
  const int64_t first = target ? static_cast<int64_t>(target->chunks.size()) : 0;
  int64_t count = static_cast<int64_t>(request.chain.size()) - first;
  SaveTicket ticket{target ? target->id : 0, first, {}};
  if (count <= 0) {
    if (target) touch(*target);
    return ticket;
  }
  if (free_dram_slots() < count) reclaim_clean_dram(count);
  if (free_dram_slots() == 0) {
    ++stats_.saves_skipped;
    work_.notify_all();
    return resource_exhausted_error("KV store: no DRAM room for " + std::to_string(count) +
                                    " chunks now");
  }
  if (free_dram_slots() < count) {
    // The leading chunks are worth keeping: a later turn loads them and extends the item.
    count = free_dram_slots();
    ++stats_.saves_partial;
    work_.notify_all();
  }
  if (target == nullptr) {
    Item item;
    item.id = next_item_++;
    item.session = request.session;
    item.exact = request.exact;
    item.token_offset = request.token_offset;
    item.stored_at = ++clock_;
    ticket.item = item.id;
    target = &items_.emplace(item.id, std::move(item)).first->second;
  }
  if (replaced && *replaced != target->id) {
    Item& old = items_.at(*replaced);
    // An exact item stays findable by content; a truncated one is reachable only by its session.
    if (!old.exact && old.pins == 0 && !old.busy && old.pending.empty()) {
      drop_item(*replaced);
    } else {
      old.session.clear();
    }
  }
  if (!request.session.empty()) {
    target->session = request.session;
    by_session_[request.session] = target->id;
  }
  target->pending.assign(request.chain.begin() + first, request.chain.begin() + first + count);
  touch(*target);
  for (int64_t i = 0; i < count; ++i) {
    ticket.destinations.push_back(dram(free_dram_.back()));
    free_dram_.pop_back();
  }
  return ticket;
}

int64_t KvStore::extend_save(SaveTicket* ticket, std::span<const kv::ChunkHash> hashes) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(ticket->item);
  if (it == items_.end() || it->second.doomed || hashes.empty()) return 0;
  Item& item = it->second;
  if (ticket->destinations.empty() &&
      (item.busy || !item.pending.empty() ||
       static_cast<int64_t>(item.chunks.size()) != ticket->first_chunk)) {
    return 0;
  }
  const auto wanted = static_cast<int64_t>(hashes.size());
  if (free_dram_slots() < wanted) reclaim_clean_dram(wanted);
  const int64_t count = std::min(wanted, free_dram_slots());
  if (count < wanted) {
    ++stats_.saves_partial;
    work_.notify_all();
  }
  for (int64_t i = 0; i < count; ++i) {
    item.pending.push_back(hashes[i]);
    ticket->destinations.push_back(dram(free_dram_.back()));
    free_dram_.pop_back();
  }
  touch(item);
  return count;
}

void KvStore::publish(const SaveTicket& ticket, double write_seconds) {
  Item& item = items_.at(ticket.item);
  count_chunks(static_cast<int64_t>(ticket.destinations.size()),
               item.chunks.empty() && !ticket.destinations.empty() ? 1 : 0);
  item.dram_chunks += static_cast<int64_t>(ticket.destinations.size());
  for (size_t i = 0; i < ticket.destinations.size(); ++i) {
    const int32_t index = static_cast<int32_t>(item.chunks.size());
    item.chunks.push_back({item.pending[i], slot_of(ticket.destinations[i]), -1, 0});
    if (item.exact) by_hash_[item.pending[i]] = {item.id, index};
  }
  item.pending.clear();
  const int64_t bytes = static_cast<int64_t>(ticket.destinations.size()) * options_.chunk_bytes;
  stats_.dram.bytes_in += bytes;
  stats_.dram.save_seconds += write_seconds;
  ++stats_.dram.saves;
  publications_.fetch_add(1, std::memory_order_relaxed);
  touch(item);
  // Its session ended while the save ran: truncated history is reachable by session only.
  if (!item.exact && item.session.empty()) drop_item(item.id);
}

void KvStore::commit_save(SaveTicket ticket, std::function<void()> wait, double write_seconds) {
  if (ticket.destinations.empty()) return;
  {
    std::scoped_lock lock(mutex_);
    if (wait) {
      commits_.push_back({std::move(ticket), std::move(wait), write_seconds});
    } else {
      publish(ticket, write_seconds);
    }
  }
  work_.notify_all();
}

void KvStore::abort_save(const SaveTicket& ticket) {
  if (ticket.destinations.empty()) return;
  std::scoped_lock lock(mutex_);
  for (std::byte* p : ticket.destinations) free_dram_.push_back(slot_of(p));
  Item& item = items_.at(ticket.item);
  item.pending.clear();
  if (item.chunks.empty()) drop_item(item.id);
}

void KvStore::set_queue(std::vector<ItemId> queue) {
  {
    std::scoped_lock lock(mutex_);
    queue_ = std::move(queue);
  }
  work_.notify_all();
}

bool KvStore::erase_session(const std::string& session) {
  std::unique_lock lock(mutex_);
  auto it = by_session_.find(session);
  if (it == by_session_.end()) return false;
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

bool KvStore::reclaim_clean_dram(int64_t n) {
  while (free_dram_slots() < n) {
    // Candidates: unpinned items whose every chunk is in DRAM and on SSD.
    std::vector<ItemView> clean;
    for (const ItemView& v : views()) {
      const Item& item = items_.at(v.id);
      const int64_t n = static_cast<int64_t>(item.chunks.size());
      if (n > 0 && item.dram_chunks == n && item.ssd_chunks == n) clean.push_back(v);
    }
    const std::optional<ItemId> victim =
        choose_dram_victim(options_.policy, clean, queue_, eviction_window());
    if (!victim) return false;
    Item& item = items_.at(*victim);
    for (Chunk& c : item.chunks) {
      free_dram_.push_back(c.dram_slot);
      c.dram_slot = -1;
    }
    item.dram_chunks = 0;
    ++stats_.dram.evictions;
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
  if (item.pins > 0) {
    // A lease still reads its chunks: unreachable now, removed at the last release.
    item.doomed = true;
    return;
  }
  std::vector<int64_t> ssd_slots;
  for (const Chunk& c : item.chunks) {
    if (c.dram_slot >= 0) free_dram_.push_back(c.dram_slot);
    if (c.ssd_slot >= 0) ssd_slots.push_back(c.ssd_slot);
  }
  if (!ssd_slots.empty() && ssd_) {
    // The DROP must be durable before the slots can be reused.
    if (ssd_->journal_drop(id).ok()) ssd_->free(ssd_slots);
  }
  if (!item.chunks.empty()) count_chunks(-static_cast<int64_t>(item.chunks.size()), -1);
  items_.erase(it);
}

void KvStore::drop_ssd_copy(ItemId id) {
  Item& item = items_.at(id);
  bool in_dram = false;
  std::vector<int64_t> slots;
  for (Chunk& c : item.chunks) {
    in_dram |= c.dram_slot >= 0;
    if (c.ssd_slot >= 0) slots.push_back(c.ssd_slot);
  }
  ++stats_.ssd.evictions;
  if (!in_dram) return drop_item(id);
  if (!ssd_->journal_drop(id).ok()) return;
  ssd_->free(slots);
  for (Chunk& c : item.chunks) c.ssd_slot = -1;
  item.ssd_chunks = 0;
}

bool KvStore::make_ssd_room(int64_t n, ItemId exclude) {
  while (ssd_->num_free_slots() < n) {
    const std::optional<ItemId> victim =
        choose_ssd_victim(options_.policy, views(), queue_, eviction_window(), exclude);
    if (!victim) return false;
    drop_ssd_copy(*victim);
  }
  return true;
}

bool KvStore::write_to_ssd(ItemId id, std::unique_lock<std::mutex>& lock) {
  if (!ssd_usable()) return false;
  std::vector<int64_t> missing;
  for (size_t i = 0; i < items_.at(id).chunks.size(); ++i) {
    if (items_.at(id).chunks[i].ssd_slot < 0) missing.push_back(static_cast<int64_t>(i));
  }
  if (missing.empty()) return true;
  if (!make_ssd_room(static_cast<int64_t>(missing.size()), id)) return false;
  std::vector<int64_t> slots = ssd_->allocate(static_cast<int64_t>(missing.size())).value();
  std::vector<const std::byte*> buffers;
  std::vector<ChunkRecord> records;
  const Item& item = items_.at(id);
  const ItemRecord attributes{item.session, item.exact, item.token_offset};
  for (size_t j = 0; j < missing.size(); ++j) {
    const Chunk& c = item.chunks[missing[j]];
    buffers.push_back(dram(c.dram_slot));
    records.push_back({id, static_cast<int32_t>(missing[j]), c.hash, slots[j], 0});
  }
  lock.unlock();
  const Clock::time_point start = Clock::now();
  for (size_t j = 0; j < buffers.size(); ++j) {
    records[j].checksum = XXH3_64bits(buffers[j], static_cast<size_t>(options_.chunk_bytes));
  }
  Status status = ssd_->write(slots, buffers);
  if (status.ok()) status = ssd_->journal_put(attributes, records);
  const double seconds = seconds_since(start);
  lock.lock();
  if (!status.ok()) {
    ssd_failed_ = true;
    ssd_->free(slots);
    spdlog::warn("KV store: the SSD tier failed ({}); continuing with DRAM only",
                 status.to_string());
    return false;
  }
  Item& now = items_.at(id);
  for (size_t j = 0; j < missing.size(); ++j) {
    now.chunks[missing[j]].ssd_slot = slots[j];
    now.chunks[missing[j]].checksum = records[j].checksum;
  }
  now.ssd_chunks += static_cast<int64_t>(missing.size());
  const int64_t bytes = static_cast<int64_t>(missing.size()) * options_.chunk_bytes;
  stats_.ssd.bytes_in += bytes;
  stats_.dram.bytes_out += bytes;
  stats_.ssd.save_seconds += seconds;
  ++stats_.ssd.saves;
  return true;
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
  stats_.expired += static_cast<int64_t>(expired.size());
}

KvStore::Action KvStore::next_action(ItemId* id, bool claim) {
  const std::vector<ItemView> all = views();
  const int64_t reserve = static_cast<int64_t>(
      std::ceil(options_.dram_reserve_fraction * static_cast<double>(dram_slots_total())));
  const int64_t prefetch_window_length = prefetch_window();
  auto first_position = [&](ItemId item) {
    auto it = std::find(queue_.begin(), queue_.end(), item);
    return it == queue_.end() ? INT64_MAX : it - queue_.begin();
  };
  if (free_dram_slots() + dram_slots_demoting_ < reserve) {
    const std::optional<ItemId> victim =
        choose_dram_victim(options_.policy, all, queue_, eviction_window());
    // Never demote what the prefetcher just brought in for the jobs about to run.
    const bool protected_job = options_.policy == EvictionPolicy::kSchedulerAware && victim &&
                               first_position(*victim) < prefetch_window_length;
    if (victim && !protected_job) {
      if (claim) {
        Item& item = items_.at(*victim);
        item.busy = true;
        for (const Chunk& c : item.chunks) dram_slots_demoting_ += c.dram_slot >= 0;
      }
      *id = *victim;
      return Action::kDemote;
    }
  }
  if (options_.policy == EvictionPolicy::kSchedulerAware && ssd_usable()) {
    for (ItemId candidate : prefetch_candidates(all, queue_, prefetch_window_length)) {
      int64_t missing = 0;
      for (const Chunk& c : items_.at(candidate).chunks) missing += c.dram_slot < 0;
      if (missing > free_dram_slots()) continue;
      if (claim) items_.at(candidate).busy = true;
      *id = candidate;
      return Action::kPrefetch;
    }
  }
  return Action::kNone;
}

void KvStore::prefetch(ItemId id) {
  std::unique_lock lock(mutex_);
  if (fetch_from_ssd(id, 0, static_cast<int64_t>(items_.at(id).chunks.size()), lock).ok()) {
    ++stats_.prefetches;
  }
}

Status KvStore::fetch_from_ssd(ItemId id, int64_t first, int64_t count,
                               std::unique_lock<std::mutex>& lock) {
  Item& item = items_.at(id);
  std::vector<int64_t> missing, slots;
  std::vector<std::byte*> buffers;
  std::vector<int32_t> dram_slots;
  std::vector<uint64_t> checksums;
  for (int64_t i = first; i < first + count; ++i) {
    if (item.chunks[i].dram_slot >= 0) continue;
    STRATA_CHECK(!free_dram_.empty()) << "fetch_from_ssd without DRAM room";
    missing.push_back(i);
    slots.push_back(item.chunks[i].ssd_slot);
    checksums.push_back(item.chunks[i].checksum);
    dram_slots.push_back(free_dram_.back());
    free_dram_.pop_back();
    buffers.push_back(dram(dram_slots.back()));
  }
  lock.unlock();
  const Clock::time_point start = Clock::now();
  Status status = ssd_->read(slots, buffers);
  for (size_t j = 0; status.ok() && j < buffers.size(); ++j) {
    if (XXH3_64bits(buffers[j], static_cast<size_t>(options_.chunk_bytes)) != checksums[j]) {
      status = data_loss_error("KV store: chunk " + std::to_string(missing[j]) + " of item " +
                               std::to_string(id) + " (SSD slot " + std::to_string(slots[j]) +
                               ") fails its checksum");
    }
  }
  const double seconds = seconds_since(start);
  lock.lock();
  Item& now = items_.at(id);
  now.busy = false;
  idle_.notify_all();
  if (!status.ok()) {
    for (int32_t s : dram_slots) free_dram_.push_back(s);
    ++stats_.corrupt_chunks;
    spdlog::warn("{}; dropping the conversation, its turn is recomputed", status.message());
    drop_item(id);
    return Status(StatusCode::kDataLoss, status.message());
  }
  for (size_t j = 0; j < missing.size(); ++j) now.chunks[missing[j]].dram_slot = dram_slots[j];
  now.dram_chunks += static_cast<int64_t>(missing.size());
  const int64_t bytes = static_cast<int64_t>(missing.size()) * options_.chunk_bytes;
  stats_.ssd.bytes_out += bytes;
  stats_.dram.bytes_in += bytes;
  stats_.ssd.load_seconds += seconds;
  ++stats_.ssd.loads;
  return Status();
}

void KvStore::demote(ItemId id) {
  std::unique_lock lock(mutex_);
  const bool persisted = write_to_ssd(id, lock);
  Item& item = items_.at(id);
  item.busy = false;
  for (const Chunk& c : item.chunks) dram_slots_demoting_ -= c.dram_slot >= 0;
  ++stats_.dram.evictions;
  if (!persisted) return drop_item(id);  // no SSD room: the item leaves the store
  for (Chunk& c : item.chunks) {
    if (c.dram_slot >= 0) free_dram_.push_back(c.dram_slot);
    c.dram_slot = -1;
  }
  item.dram_chunks = 0;
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
    ItemId id = 0;
    const Action action = next_action(&id, true);
    if (action == Action::kNone) {
      idle_.notify_all();
      work_.wait_for(lock, std::chrono::seconds(1));
      continue;
    }
    ++active_actions_;
    lock.unlock();
    if (action == Action::kPrefetch) {
      prefetch(id);
    } else {
      demote(id);
    }
    lock.lock();
    --active_actions_;
    idle_.notify_all();
  }
}

void KvStore::wait_idle() {
  std::unique_lock lock(mutex_);
  ItemId unused = 0;
  idle_.wait(lock, [&] {
    return commits_.empty() && active_actions_ == 0 && next_action(&unused, false) == Action::kNone;
  });
}

StoreStats KvStore::stats() const {
  std::scoped_lock lock(mutex_);
  StoreStats s = stats_;
  s.items = static_cast<int64_t>(items_.size());
  s.dram_chunks_total = dram_slots_total();
  s.dram_chunks_used = s.dram_chunks_total - free_dram_slots();
  if (ssd_) {
    s.ssd_chunks_total = ssd_->num_slots();
    s.ssd_chunks_used = ssd_->num_slots() - ssd_->num_free_slots();
  }
  s.ssd_available = ssd_usable();
  return s;
}

}  // namespace strata::store
