// Items this process did not save: those a persistent tier recovered at open, and those a shared
// tier (the remote tier other replicas write, store/redis_tier.h) holds. Every published item but
// token-dropped ones is written through to the shared tier by the I/O threads, and a prompt is
// looked up in it before its request is admitted, on the submitting thread, so the step thread
// never waits on the network for it.
#include <algorithm>
#include <spdlog/spdlog.h>

#include "strata/kv/prefix_hash.h"
#include "strata/store/kv_store.h"

namespace strata::store {

void KvStore::adopt(TierIndex t, std::vector<RecoveredItem> recovered) {
  int64_t adopted = 0;
  for (const RecoveredItem& r : recovered) adopted += adopt_item(t, r) ? 1 : 0;
  if (adopted > 0) {
    spdlog::info("KV store: recovered {} conversations from the {} tier", adopted, tiers_[t]->name());
  }
}

bool KvStore::adopt_item(TierIndex t, const RecoveredItem& r) {
  // Values in a codec this deployment does not have cannot be decoded: left out.
  auto codec = std::find_if(options_.codecs.begin(), options_.codecs.end(), [&](const ItemCodec& c) {
    return c.name == (r.attributes.codec.empty() ? "none" : r.attributes.codec);
  });
  // Merged values of another pair count (another layer_share) do not decode either.
  if (codec == options_.codecs.end() ||
      (codec->merged_pairs > 0 && std::ssize(r.attributes.layer_pairs) != codec->merged_pairs)) {
    (void)tiers_[t]->evict(r.id);  // its room is the tier's again
    return false;
  }
  auto [it, added] = items_.try_emplace(r.id);
  Item& item = it->second;
  if (added) {
    item.id = r.id;
    item.session = r.attributes.session;
    item.exact = r.attributes.exact;
    item.token_offset = r.attributes.token_offset;
    item.skipped_chunks = r.attributes.skipped_chunks;
    // A family this deployment's profile does not list (or none) weighs the default quality.
    item.task = std::max(0, options_.adaptcache.task_index(r.attributes.task));
    item.codec = static_cast<int32_t>(codec - options_.codecs.begin());
    item.layer_pairs = r.attributes.layer_pairs;
    item.whole_chunks = r.attributes.whole_chunks;
    ++stats_.codec_items[item.codec];
    item.stored_at = item.last_access = ++clock_;
    item.touched = std::chrono::steady_clock::now();
    next_item_ = std::max(next_item_, r.id + 1);
    if (!item.session.empty()) by_session_[item.session] = r.id;
  }
  // An item another tier recovered too keeps the chunks both agree on.
  for (const ChunkKey& key : r.chunks) {
    // A stored suffix is a raw or layer-merged chunk's tail from a layer on.
    if (key.first_layer > 0 &&
        (!keeps_suffix(item.codec) || key.first_layer >= options_.chunk_layers)) {
      break;
    }
    if (key.index < std::ssize(item.chunks)) {
      const Chunk& known = item.chunks[key.index];
      if (known.hash != key.hash || known.first_layer != key.first_layer) break;
    } else if (key.index == std::ssize(item.chunks)) {
      item.chunks.push_back({key.hash, 0, nullptr, key.first_layer});
      item.suffix_chunks = item.suffix_chunks || key.first_layer > 0;
      if (item.content_indexed(options_.block_size_tokens)) index_chunk(item, key.index);
      published_chunks_ += 1;
      published_items_ += item.chunks.size() == 1 ? 1 : 0;
    } else {
      break;
    }
    set_held(item, key.index, t, true);
  }
  return true;
}

std::optional<ItemId> KvStore::write_through_candidate() const {
  if (shared_tier_ == nullptr || !usable(shared_)) return std::nullopt;
  for (const auto& [id, item] : items_) {
    const int64_t n = std::ssize(item.chunks);
    // A token-dropped item stays on this replica: the shared tier indexes chains without gaps;
    // so do a merged one, one with whole chunks (H2O's) and a stored suffix (Krul's), whose
    // layer pairs, whole chunks and first layers the shared records do not carry.
    if (item.busy || item.doomed || !item.pending.empty() || n == 0 || item.shared_written >= n ||
        item.held[shared_] == n || item.skipped_chunks > 0 || item.whole_chunks > 0 ||
        item.suffix() || options_.codecs[item.codec].merged_pairs > 0) {
      continue;
    }
    bool in_dram = true;  // what the shared tier lacks is read from DRAM
    for (const Chunk& c : item.chunks) {
      in_dram = in_dram && ((c.tiers & (1u << shared_)) != 0 || c.dram != nullptr);
    }
    if (in_dram) return id;
  }
  return std::nullopt;
}

void KvStore::write_through(ItemId id) {
  std::unique_lock lock(mutex_);
  (void)write_down(id, shared_, lock);  // a refusal (full, too large, down) is counted by the tier
  Item& item = items_.at(id);
  item.busy = false;
}

void KvStore::look_up_shared(std::span<const TokenId> prompt, const kv::ChunkHash& root,
                             const std::string& session) {
  if (shared_tier_ == nullptr || !usable(shared_)) return;
  const int64_t block = options_.block_size_tokens;
  const int64_t n = std::ssize(prompt);
  int64_t here = 0;
  {
    std::unique_lock lock(mutex_);
    ++stats_.shared_lookups;
    if (std::optional<StoreMatch> m = match(prompt, root, session)) {
      here = m->num_chunks;
      // Indexed here but held only there (demoted out of DRAM): read into DRAM now, off the step
      // thread, like an item another replica stored.
      if (m->tier == shared_ && !items_.at(m->item).busy) {
        return read_shared_into_dram(m->item, m->num_chunks, lock);
      }
    }
  }
  // The session's item there, as far as it matches the prompt (find()'s rule), else the longest
  // run of the prompt's chained content hashes.
  std::optional<RecoveredItem> found;
  if (!session.empty()) {
    StatusOr<std::optional<RecoveredItem>> record = shared_tier_->find_session(session);
    if (!record.ok()) return;
    if (*record) {
      RecoveredItem& r = **record;
      const int64_t matched = session_chunks_matching(prompt, root, r.attributes.token_offset,
                                                      /*skipped_chunks=*/0, std::ssize(r.chunks),
                                                      [&](int64_t i) { return r.chunks[i].hash; });
      r.chunks.resize(matched);
      if (matched > 0) found = std::move(r);
    }
  }
  if (!found) {
    std::vector<kv::ChunkHash> chain;
    kv::ChunkHash h = root;
    for (int64_t i = 0; i < (n - 1) / block; ++i) {
      h = kv::chain_hash(h, prompt.subspan(i * block, block));
      chain.push_back(h);
    }
    StatusOr<int64_t> held = shared_tier_->count_held(chain);
    if (!held.ok() || *held == 0) return;
    RecoveredItem r;
    for (int64_t i = 0; i < *held; ++i) r.chunks.push_back({0, static_cast<int32_t>(i), chain[i]});
    found = std::move(r);
  }
  const int64_t count = std::ssize(found->chunks);
  if (count <= here) return;

  std::unique_lock lock(mutex_);
  found->id = next_item_++;
  for (ChunkKey& key : found->chunks) key.item = found->id;
  shared_tier_->attach(*found);
  if (!adopt_item(shared_, *found)) return;
  ++stats_.shared_found;
  read_shared_into_dram(found->id, count, lock);
}

void KvStore::read_shared_into_dram(ItemId id, int64_t count, std::unique_lock<std::mutex>& lock) {
  if (!reclaim_clean_dram(count)) return;  // no room: the load reads it straight for the device
  Item& item = items_.at(id);
  item.busy = true;
  item.fetched_from = shared_;
  TierIndex from = kDramTier;
  if (fetch(id, 0, count, nullptr, &from, lock).ok()) work_.notify_all();  // else dropped
}

}  // namespace strata::store
