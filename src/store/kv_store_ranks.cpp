// The store under tensor parallelism (store_followers.h): chunk layouts named per rank, each
// rank's options, and runs of chunks named by content so that every rank pins its own copy.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "strata/store/kv_store.h"
#include "xxhash.h"

namespace strata::store {

// A stable digest (XXH3 over a versioned text). Version 2: the layer merge's stored form in
// layer order (docs/krul.md decision 8).
uint64_t layout_tag(uint64_t model_fingerprint, const kv::KvFormat& format,
                    int64_t block_size_tokens, int64_t chunk_bytes) {
  char text[256];
  const int n = std::snprintf(
      text, sizeof(text), "strata-kv-layout/2 model=%016llx format=%s block=%lld chunk=%lld",
      static_cast<unsigned long long>(model_fingerprint), kv::format_name(format).c_str(),
      static_cast<long long>(block_size_tokens), static_cast<long long>(chunk_bytes));
  return XXH3_64bits(text, static_cast<size_t>(n));
}

void make_rank_options(StoreOptions* options, int32_t rank, int32_t world_size, int64_t kv_heads,
                       int64_t max_kv_heads) {
  if (world_size <= 1) return;
  const std::string name = "tp" + std::to_string(world_size) + "-rank" + std::to_string(rank);
  auto scaled = [&](int64_t bytes) { return bytes / max_kv_heads * kv_heads; };
  options->dram_bytes = scaled(options->dram_bytes);
  for (SsdOptions& tier : options->tiers) {
    tier.dir = (std::filesystem::path(tier.dir) / name).string();
    tier.capacity_bytes = scaled(tier.capacity_bytes);
  }
  if (options->remote) {
    options->remote->capacity_bytes = scaled(options->remote->capacity_bytes);
    options->remote->max_item_bytes = scaled(options->remote->max_item_bytes);
  }
  options->layout_tag = XXH3_64bits_withSeed(name.data(), name.size(), options->layout_tag);
}

std::optional<StoredRun> KvStore::describe_run(ItemId id, int64_t first, int64_t count) const {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(id);
  if (it == items_.end() || count <= 0 || std::ssize(it->second.chunks) < first + count) {
    return std::nullopt;
  }
  const Item& item = it->second;
  return StoredRun{item.session,
                   item.chunks[first + count - 1].hash,
                   first,
                   count,
                   item.token_offset,
                   item.skipped_chunks,
                   item.exact};
}

std::vector<kv::ChunkHash> KvStore::chunk_hashes(ItemId id, int64_t count) const {
  std::scoped_lock lock(mutex_);
  std::vector<kv::ChunkHash> hashes;
  auto it = items_.find(id);
  if (it == items_.end()) return hashes;
  for (int64_t i = 0; i < std::min(count, std::ssize(it->second.chunks)); ++i) {
    hashes.push_back(it->second.chunks[i].hash);
  }
  return hashes;
}

int64_t KvStore::held_prefix(const StoredRun& run, std::span<const kv::ChunkHash> hashes) const {
  // Chained hashes: the item holding chunk k - 1's hash at k - 1 holds the k chunks before it.
  for (int64_t k = std::ssize(hashes); k > 0; --k) {
    StoredRun prefix = run;
    prefix.first_chunk = 0;
    prefix.count = k;
    prefix.last_hash = hashes[k - 1];
    const std::optional<ItemId> found = find_run(prefix);
    if (!found) continue;
    std::scoped_lock lock(mutex_);
    auto it = items_.find(*found);
    if (it == items_.end()) continue;
    // Only chunks some usable tier holds can be loaded.
    int64_t readable = 0;
    while (readable < k && (it->second.chunks[readable].dram != nullptr ||
                            source_of(it->second.chunks[readable]) >= 0)) {
      ++readable;
    }
    return readable;
  }
  return 0;
}

std::optional<ItemId> KvStore::find_run(const StoredRun& run) const {
  const int64_t last = run.first_chunk + run.count - 1;
  auto copy_of_run = [&](ItemId id) {
    auto it = items_.find(id);
    if (it == items_.end() || run.count <= 0 || std::ssize(it->second.chunks) <= last) return false;
    const Item& item = it->second;
    return item.chunks[last].hash == run.last_hash && item.token_offset == run.token_offset &&
           item.skipped_chunks == run.skipped_chunks && item.exact == run.exact;
  };
  std::scoped_lock lock(mutex_);
  if (auto s = by_session_.find(run.session);
      !run.session.empty() && s != by_session_.end() && copy_of_run(s->second)) {
    return s->second;
  }
  if (auto h = by_hash_.find(run.last_hash);
      h != by_hash_.end() && h->second.second == last && copy_of_run(h->second.first)) {
    return h->second.first;
  }
  return std::nullopt;
}

StatusOr<StoreLease> KvStore::acquire_run(const StoredRun& run) {
  const std::optional<ItemId> found = find_run(run);
  if (!found) {
    std::scoped_lock lock(mutex_);
    for (TierCounters& c : counters_) ++c.misses;
    return not_found_error("KV store: no copy of chunks " + std::to_string(run.first_chunk) + ".." +
                           std::to_string(run.first_chunk + run.count - 1) +
                           " of the item rank 0 loads");
  }
  // Moved or dropped meanwhile: acquire() says so.
  return acquire(*found, run.first_chunk, run.count, run.skipped_chunks);
}

}  // namespace strata::store
