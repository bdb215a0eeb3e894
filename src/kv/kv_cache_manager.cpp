#include "strata/kv/kv_cache_manager.h"

#include <algorithm>
#include <unordered_set>

#include "strata/common/check.h"
#include "strata/kv/prefix_hash.h"

namespace strata::kv {

Status KvGeometry::validate() const {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v > 0) return Status();
    return invalid_argument_error(std::string("kv geometry: ") + name + " must be positive, got " +
                                  std::to_string(v));
  };
  STRATA_RETURN_IF_ERROR(positive("num_layers", num_layers));
  STRATA_RETURN_IF_ERROR(positive("num_kv_heads", num_kv_heads));
  STRATA_RETURN_IF_ERROR(positive("head_dim", head_dim));
  STRATA_RETURN_IF_ERROR(positive("block_size_tokens", block_size_tokens));
  STRATA_RETURN_IF_ERROR(positive("num_blocks", num_blocks));
  if (num_host_blocks < 0) {
    return invalid_argument_error("kv geometry: num_host_blocks must be >= 0, got " +
                                  std::to_string(num_host_blocks));
  }
  STRATA_RETURN_IF_ERROR(positive("page_blocks", page_blocks));
  if (num_blocks % page_blocks != 0 || num_host_blocks % page_blocks != 0) {
    return invalid_argument_error("kv geometry: page_blocks " + std::to_string(page_blocks) +
                                  " must divide num_blocks and num_host_blocks");
  }
  return Status();
}

KvCacheManager::KvCacheManager(const KvGeometry& geometry, KvFormat format,
                               PrefixCacheOptions prefix)
    : geometry_(geometry),
      format_(format),
      prefix_(prefix),
      pool_(PageLayout::of(geometry, format), geometry.num_blocks / geometry.page_blocks) {
  STRATA_CHECK(geometry.validate().ok()) << geometry.validate().to_string();
  if (geometry.num_host_blocks > 0) {
    host_pool_ = std::make_unique<BlockPool>(pool_.layout(),
                                             geometry.num_host_blocks / geometry.page_blocks);
  }
}

const KvCacheManager::Sequence& KvCacheManager::get(SeqId seq) const {
  auto it = sequences_.find(seq);
  STRATA_CHECK(it != sequences_.end()) << "unknown sequence " << seq.value;
  return it->second;
}

KvCacheManager::Sequence& KvCacheManager::get(SeqId seq) {
  auto it = sequences_.find(seq);
  STRATA_CHECK(it != sequences_.end()) << "unknown sequence " << seq.value;
  return it->second;
}

Status KvCacheManager::add_sequence(SeqId seq, std::vector<TokenId> prompt, std::string tenant_salt,
                                    bool cacheable, KvLayout layout) {
  if (sequences_.contains(seq)) {
    return invalid_argument_error("sequence " + std::to_string(seq.value) + " already exists");
  }
  if (prompt.empty()) return invalid_argument_error("a sequence needs at least one token");
  Sequence s;
  STRATA_RETURN_IF_ERROR(apply_layout(layout, s));
  s.tokens = std::move(prompt);
  s.tenant_salt = std::move(tenant_salt);
  s.cacheable = cacheable;
  // Sequences of different layouts hold different bytes for the same tokens: they never share.
  s.last_hash = layout.is_default() ? prefix_root(prefix_.model_fingerprint, format_,
                                                  geometry_.block_size_tokens, s.tenant_salt)
                                    : prefix_root(prefix_.model_fingerprint, layout_name(s),
                                                  geometry_.block_size_tokens, s.tenant_salt);
  s.layout = std::move(layout);
  sequences_.emplace(seq, std::move(s));
  ++generation_;
  return Status();
}

Status KvCacheManager::apply_layout(const KvLayout& layout, Sequence& s) const {
  const int32_t layers = geometry_.num_layers;
  const int32_t groups = layout.head_groups;
  if (groups < 1 || geometry_.num_kv_heads % groups != 0 ||
      (groups > 1 && std::find(geometry_.head_groups.begin(), geometry_.head_groups.end(),
                               groups) == geometry_.head_groups.end())) {
    return invalid_argument_error("KV layout: " + std::to_string(groups) +
                                  " head groups is not a split the pool was built for");
  }
  const size_t tables = static_cast<size_t>(layers) * groups;
  s.groups_per_layer = groups;
  s.heads = groups == 1 ? 0 : geometry_.num_kv_heads / groups;
  s.formats.assign(tables, format_);
  s.owners.resize(tables);
  for (size_t t = 0; t < tables; ++t) s.owners[t] = static_cast<int32_t>(t);
  if (!layout.formats.empty()) {
    if (layout.formats.size() != tables) {
      return invalid_argument_error("KV layout: " + std::to_string(layout.formats.size()) +
                                    " formats for " + std::to_string(tables) + " page tables");
    }
    for (size_t t = 0; t < tables; ++t) {
      if (!pool_.layout().holds(layout.formats[t], s.heads)) {
        return invalid_argument_error("KV layout: layer " + std::to_string(t / groups) +
                                      "'s format " + format_name(layout.formats[t]) +
                                      " is not one the pool holds");
      }
    }
    s.formats = layout.formats;
  }
  if (layout.shared_with.empty()) return Status();
  if (layout.shared_with.size() != static_cast<size_t>(layers)) {
    return invalid_argument_error("KV layout: " + std::to_string(layout.shared_with.size()) +
                                  " sharing entries for " + std::to_string(layers) + " layers");
  }
  for (int32_t l = 0; l < layers; ++l) {
    const int32_t owner = layout.shared_with[l];
    if (owner < 0) continue;
    bool same_format = owner < l;
    for (int32_t g = 0; g < groups && same_format; ++g) {
      same_format = s.formats[owner * groups + g] == s.formats[l * groups + g];
    }
    if (owner >= l || layout.shared_with[owner] >= 0 || !same_format) {
      return invalid_argument_error("KV layout: layer " + std::to_string(l) +
                                    " can share only an earlier layer that shares none, in the "
                                    "same format (got layer " +
                                    std::to_string(owner) + ")");
    }
    for (int32_t g = 0; g < groups; ++g) s.owners[l * groups + g] = owner * groups + g;
  }
  return Status();
}

std::string KvCacheManager::layout_name(const Sequence& s) {
  std::string name = "groups" + std::to_string(s.groups_per_layer);
  for (size_t t = 0; t < s.formats.size(); ++t) {
    name += ";" + format_name(s.formats[t]);
    if (s.owners[t] != static_cast<int32_t>(t)) name += "=" + std::to_string(s.owners[t]);
  }
  return name;
}

void KvCacheManager::append_tokens(SeqId seq, std::span<const TokenId> tokens) {
  Sequence& s = get(seq);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  ++generation_;
}

std::vector<ChunkHash> KvCacheManager::match_prefix(const Sequence& s) const {
  std::vector<ChunkHash> hashes;
  if (!prefix_.enabled || !s.cacheable || s.off_pool || num_token_blocks(s) > 0) return hashes;
  const int64_t block = geometry_.block_size_tokens;
  const int64_t max_blocks = (static_cast<int64_t>(s.tokens.size()) - 1) / block;
  ChunkHash h = s.last_hash;  // the root: a sequence without blocks has hashed nothing
  for (int64_t i = 0; i < max_blocks; ++i) {
    h = chain_hash(h, std::span<const TokenId>(s.tokens).subspan(i * block, block));
    if (pool_.find_cached(h) == nullptr) break;
    hashes.push_back(h);
  }
  return hashes;
}

void KvCacheManager::set_external_prefix(SeqId seq, int64_t num_blocks, bool exact) {
  Sequence& s = get(seq);
  STRATA_CHECK(s.tables.empty()) << "sequence " << seq.value << " already has blocks";
  STRATA_CHECK_LT(num_blocks * geometry_.block_size_tokens, static_cast<int64_t>(s.tokens.size()));
  s.external_blocks = num_blocks;
  s.cacheable = exact;
  ++generation_;
}

int64_t KvCacheManager::lookup_prefix(SeqId seq) const {
  const Sequence& s = get(seq);
  if (s.off_pool || num_token_blocks(s) > 0) return 0;
  const int64_t cached = static_cast<int64_t>(match_prefix(s).size());
  return std::max(cached, s.external_blocks) * geometry_.block_size_tokens;
}

StatusOr<KvPlan> KvCacheManager::prepare(std::vector<KvRequest> requests) const {
  KvPlan plan;
  plan.generation_ = generation_;
  const int64_t block = geometry_.block_size_tokens;
  std::vector<ChunkHash> acquired;  // evictable groups this plan takes
  std::unordered_set<SeqId> seen;
  std::vector<int64_t> needed(pool_.layout().kinds().size(), 0);  // blocks to allocate, per kind
  for (const KvRequest& r : requests) {
    STRATA_CHECK(seen.insert(r.seq).second) << "sequence " << r.seq.value << " planned twice";
    STRATA_CHECK(r.num_new_tokens > 0) << "empty request for sequence " << r.seq.value;
    const Sequence& s = get(r.seq);
    if (s.off_pool) {
      STRATA_CHECK_LE(s.num_computed + r.num_new_tokens, std::ssize(s.tokens))
          << "sequence " << r.seq.value << " has no tokens for that many positions";
      continue;
    }
    int64_t computed = s.num_computed;
    int64_t have_blocks = num_token_blocks(s);
    std::vector<ChunkHash> hashes = match_prefix(s);
    const int64_t loads = have_blocks == 0 ? blocks_to_load(s, hashes.size()) : 0;
    if (!hashes.empty()) {
      for (const ChunkHash& h : hashes) {
        if (pool_.is_evictable(h)) acquired.push_back(h);
      }
      computed = static_cast<int64_t>(hashes.size()) * block;
      have_blocks = static_cast<int64_t>(hashes.size());
      plan.attaches_.push_back({r.seq, std::move(hashes)});
    }
    computed += loads * block;  // allocated below with the blocks to compute
    STRATA_CHECK_LE(computed + r.num_new_tokens, static_cast<int64_t>(s.tokens.size()))
        << "sequence " << r.seq.value << " has no tokens for that many positions";
    const int64_t want_blocks = (computed + r.num_new_tokens + block - 1) / block;
    const int64_t tables = std::ssize(s.owners);
    for (int64_t t = 0; t < tables; ++t) {
      if (s.owners[t] != t) continue;  // shares another layer's blocks
      count(needed, s, t, want_blocks - std::min(want_blocks, have_blocks));
      // Every block comes back from the host pool.
      if (s.swapped) count(needed, s, t, have_blocks);
    }
    if (s.swapped) continue;
    // Writing into a partial last block that another sequence shares needs a private copy.
    if (computed % block != 0 && have_blocks > 0 && std::ssize(s.tables) == tables) {
      for (int64_t t = 0; t < tables; ++t) {
        if (s.owners[t] == t && is_shared(s, t, have_blocks - 1)) count(needed, s, t, 1);
      }
    }
  }
  std::sort(acquired.begin(), acquired.end());
  acquired.erase(std::unique(acquired.begin(), acquired.end()), acquired.end());
  const int64_t pages = pool_.pages_pinned_by(acquired) + pages_for(pool_, needed);
  if (pages > pool_.num_available_pages()) {
    const int64_t page_blocks = pool_.layout().page_blocks();
    return resource_exhausted_error("KV cache: step needs " + std::to_string(pages * page_blocks) +
                                    " blocks, " + std::to_string(pool_.num_available()) +
                                    " available");
  }
  plan.requests_ = std::move(requests);
  plan.num_blocks_needed_ = static_cast<int32_t>(pages * pool_.layout().page_blocks());
  return plan;
}

bool KvCacheManager::is_shared(const Sequence& s, int64_t table, int64_t token_block) const {
  const BlockId b = s.tables[table][token_block];
  const auto entries = std::count(s.owners.begin(), s.owners.end(), s.owners[table]);
  return pool_.refcount(b) > entries;
}

void KvCacheManager::count(std::vector<int64_t>& per_kind, const Sequence& s, int64_t table,
                           int64_t n) const {
  const std::vector<BlockKind>& kinds = pool_.layout().kinds();
  const BlockKind kind = pool_.layout().kind(s.formats[table], s.heads);
  per_kind[std::find(kinds.begin(), kinds.end(), kind) - kinds.begin()] += n;
}

int64_t KvCacheManager::pages_for(const BlockPool& pool, const std::vector<int64_t>& per_kind) {
  int64_t pages = 0;
  for (size_t k = 0; k < per_kind.size(); ++k) {
    const BlockKind& kind = pool.layout().kinds()[k];
    pages += pool.pages_for(per_kind[k], kind.format, kind.heads);
  }
  return pages;
}

void KvCacheManager::commit(KvPlan&& plan, StepCopies* copies) {
  STRATA_CHECK_EQ(plan.generation_, generation_) << "stale KV plan";
  ++generation_;
  const int64_t block = geometry_.block_size_tokens;
  std::unordered_map<SeqId, const std::vector<ChunkHash>*> attaches;
  for (const KvPlan::Attach& a : plan.attaches_) attaches.emplace(a.seq, &a.hashes);

  // Attach cached prefixes first: acquiring takes those groups off the eviction list, so the
  // allocations below cannot evict a group this plan is about to use.
  for (const KvRequest& r : plan.requests_) {
    Sequence& s = get(r.seq);
    if (!s.tables.empty() || s.off_pool) continue;
    s.tables.assign(s.owners.size(), {});
    if (auto it = attaches.find(r.seq); it != attaches.end()) {
      for (const ChunkHash& h : *it->second) {
        pool_.acquire_cached(h);
        const std::vector<BlockId>& group = *pool_.find_cached(h);
        for (size_t t = 0; t < s.tables.size(); ++t) {
          pool_.retain(group[t]);
          s.tables[t].push_back(group[t]);
        }
        s.groups.push_back(h);
      }
      s.num_hashed_blocks = static_cast<int64_t>(it->second->size());
      s.last_hash = it->second->back();
      s.num_computed = s.num_hashed_blocks * block;
      s.num_prefix_hit = s.num_computed;
    }
    if (const int64_t loads = blocks_to_load(s, s.groups.size()); loads > 0) {
      copies->loads.push_back({r.seq, s.num_computed / block, loads});
      s.num_loaded = loads * block;
      s.num_computed += s.num_loaded;
    }
    if (prefix_.enabled) {
      stats_.lookup_tokens += static_cast<int64_t>(s.tokens.size());
      stats_.hit_tokens += s.num_prefix_hit;
    }
  }

  // Swapped sequences come back into fresh, private device blocks.
  for (const KvRequest& r : plan.requests_) {
    Sequence& s = get(r.seq);
    if (!s.swapped) continue;
    move_blocks(s, *host_pool_, pool_, &copies->swap_in);
    s.swapped = false;
  }

  for (const KvRequest& r : plan.requests_) {
    Sequence& s = get(r.seq);
    if (s.off_pool) continue;
    const int64_t have = num_token_blocks(s);
    const int64_t tables = std::ssize(s.tables);
    if (s.num_computed % block != 0 && have > 0) {
      for (int64_t t = 0; t < tables; ++t) {
        if (s.owners[t] != t || !is_shared(s, t, have - 1)) continue;
        const BlockId last = s.tables[t][have - 1];
        const BlockId fresh = pool_.allocate(1, s.formats[t], s.heads)[0];
        copies->device.push_back({last, fresh, s.formats[t], s.heads});
        set_entry(s, t, have - 1, fresh, pool_, pool_);
        pool_.release(fresh);  // set_entry took one reference per table entry
      }
    }
    const int64_t want = (s.num_computed + r.num_new_tokens + block - 1) / block;
    for (int64_t t = 0; t < tables && want > have; ++t) {
      if (s.owners[t] != t) continue;
      std::vector<BlockId> fresh =
          pool_.allocate(static_cast<int32_t>(want - have), s.formats[t], s.heads);
      s.tables[t].insert(s.tables[t].end(), fresh.begin(), fresh.end());
    }
    for (int64_t t = 0; t < tables && want > have; ++t) {
      if (s.owners[t] == t) continue;
      for (int64_t i = have; i < want; ++i) {
        const BlockId b = s.tables[s.owners[t]][i];
        pool_.retain(b);
        s.tables[t].push_back(b);
      }
    }
  }
}

void KvCacheManager::set_entry(Sequence& s, int64_t owner, int64_t token_block, BlockId block,
                               BlockPool& from, BlockPool& to) {
  for (size_t l = 0; l < s.tables.size(); ++l) {
    if (s.owners[l] != owner) continue;
    from.release(s.tables[l][token_block]);
    to.retain(block);
    s.tables[l][token_block] = block;
  }
}

void KvCacheManager::move_blocks(Sequence& s, BlockPool& from, BlockPool& to,
                                 std::vector<BlockCopy>* copies) {
  for (size_t t = 0; t < s.tables.size(); ++t) {
    if (s.owners[t] != static_cast<int32_t>(t)) continue;
    for (size_t i = 0; i < s.tables[t].size(); ++i) {
      const BlockId moved = to.allocate(1, s.formats[t], s.heads)[0];
      copies->push_back({s.tables[t][i], moved, s.formats[t], s.heads});
      set_entry(s, static_cast<int64_t>(t), static_cast<int64_t>(i), moved, from, to);
      to.release(moved);  // set_entry took one reference per table entry
    }
  }
}

bool KvCacheManager::can_swap_out(SeqId seq) const {
  const Sequence& s = get(seq);
  if (!host_pool_ || s.swapped || s.tables.empty()) return false;
  std::vector<int64_t> needed(pool_.layout().kinds().size(), 0);
  for (int64_t t = 0; t < std::ssize(s.tables); ++t) {
    if (s.owners[t] == t) count(needed, s, t, num_token_blocks(s));
  }
  return pages_for(*host_pool_, needed) <= host_pool_->num_available_pages();
}

void KvCacheManager::swap_out(SeqId seq, StepCopies* copies) {
  STRATA_CHECK(can_swap_out(seq)) << "swap_out of sequence " << seq.value;
  Sequence& s = get(seq);
  move_blocks(s, pool_, *host_pool_, &copies->swap_out);
  // Its device blocks are gone, so it no longer uses the cached groups they belonged to.
  for (const ChunkHash& h : s.groups) pool_.release_cached(h);
  s.groups.clear();
  s.swapped = true;
  ++generation_;
}

void KvCacheManager::mark_computed(SeqId seq, int64_t num_tokens) {
  Sequence& s = get(seq);
  const int64_t block = geometry_.block_size_tokens;
  s.num_computed += num_tokens;
  ++generation_;
  if (s.off_pool) return;
  STRATA_CHECK_LE(s.num_computed, num_token_blocks(s) * block) << "KV written beyond its blocks";
  if (!prefix_.enabled || !s.cacheable) return;
  const int64_t full = s.num_computed / block;
  for (int64_t i = s.num_hashed_blocks; i < full; ++i) {
    s.last_hash =
        chain_hash(s.last_hash, std::span<const TokenId>(s.tokens).subspan(i * block, block));
    std::vector<BlockId> group;
    group.reserve(s.tables.size());
    for (const auto& table : s.tables) group.push_back(table[i]);
    // Another sequence may have cached the same tokens first; then ours stay private.
    if (pool_.insert_cached(s.last_hash, group)) s.groups.push_back(s.last_hash);
  }
  s.num_hashed_blocks = std::max(s.num_hashed_blocks, full);
}

void KvCacheManager::move_off_pool(SeqId seq) {
  Sequence& s = get(seq);
  STRATA_CHECK(!s.swapped) << "sequence " << seq.value << " is swapped out";
  for (const auto& table : s.tables) {
    for (BlockId b : table) pool_.release(b);
  }
  for (const ChunkHash& h : s.groups) pool_.release_cached(h);
  s.tables.clear();
  s.groups.clear();
  s.off_pool = true;
  ++generation_;
}

const KvLayout& KvCacheManager::layout(SeqId seq) const { return get(seq).layout; }

void KvCacheManager::free(SeqId seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  BlockPool& owner = it->second.swapped ? *host_pool_ : pool_;
  for (const auto& table : it->second.tables) {
    for (BlockId b : table) owner.release(b);
  }
  for (const ChunkHash& h : it->second.groups) pool_.release_cached(h);
  sequences_.erase(it);
  ++generation_;
}

Status KvCacheManager::fork(SeqId parent, SeqId child) {
  if (!sequences_.contains(parent)) {
    return invalid_argument_error("fork of unknown sequence " + std::to_string(parent.value));
  }
  if (sequences_.contains(child)) {
    return invalid_argument_error("sequence " + std::to_string(child.value) + " already exists");
  }
  const Sequence& p = sequences_.at(parent);
  if (p.swapped || p.off_pool) {
    return failed_precondition_error(
        "sequence " + std::to_string(parent.value) +
        (p.swapped ? " is swapped out" : " holds its KV off the pool"));
  }
  Sequence copy = p;
  for (const auto& table : copy.tables) {
    for (BlockId b : table) pool_.retain(b);
  }
  for (const ChunkHash& h : copy.groups) pool_.acquire_cached(h);
  sequences_.emplace(child, std::move(copy));
  ++generation_;
  return Status();
}

}  // namespace strata::kv
