// Helpers of the KV store tests: chunks filled with a byte pattern derived from their hash, so
// every served chunk is checked for the right content, not just for a passing checksum.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/kv/prefix_hash.h"
#include "strata/store/kv_store.h"
#include "support/temp_dir.h"

namespace strata::store {

using test_util::TempDir;

constexpr int32_t kBlock = 4;
constexpr int64_t kChunkBytes = 6000;  // not a multiple of 4 KiB: values are padded to pages
constexpr TierIndex kSsd = 1;

inline kv::ChunkHash root() {
  return kv::prefix_root(42, kv::KvFormat::plain(DType::kFloat32),
                         kBlock, "tenant");
}

inline std::vector<TokenId> tokens(int seed, int64_t n) {
  std::vector<TokenId> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<TokenId>(seed * 1000 + i));
  return out;
}

// Hashes of the full blocks of t with `offset` tokens after the first block left out.
inline std::vector<kv::ChunkHash> chain(std::span<const TokenId> t, int64_t offset = 0) {
  std::vector<kv::ChunkHash> out;
  kv::ChunkHash h = root();
  for (int64_t b = 0;; ++b) {
    const int64_t start = b * kBlock + (b > 0 ? offset : 0);
    if (start + kBlock > static_cast<int64_t>(t.size())) break;
    h = kv::chain_hash(h, t.subspan(start, kBlock));
    out.push_back(h);
  }
  return out;
}

inline void fill(std::byte* dst, const kv::ChunkHash& h) {
  for (int64_t i = 0; i < kChunkBytes; ++i) {
    dst[i] = static_cast<std::byte>((h.low >> (i % 64)) ^ (h.high >> (i % 61)) ^ static_cast<uint64_t>(i));
  }
}

inline bool holds(const std::byte* src, const kv::ChunkHash& h) {
  std::vector<std::byte> want(kChunkBytes);
  fill(want.data(), h);
  return std::memcmp(src, want.data(), kChunkBytes) == 0;
}

inline StoreOptions options(const TempDir* ssd_dir, int64_t dram_chunks, int64_t ssd_chunks = 0) {
  StoreOptions o;
  o.chunk_bytes = kChunkBytes;
  o.block_size_tokens = kBlock;
  o.dram_bytes = dram_chunks * 8192;
  if (ssd_dir != nullptr) {
    o.tiers.push_back(
        {.name = "ssd", .dir = ssd_dir->file("ssd"), .capacity_bytes = ssd_chunks * 8192, .file_bytes = 16 * 8192});
  }
  o.layout_tag = 7;
  o.dram_reserve_fraction = 0;
  o.ttl = std::chrono::seconds(0);
  return o;
}

// Saves the full blocks of `t` (chunks filled with their hash pattern).
inline Status save(KvStore& store, std::span<const TokenId> t, const std::string& session = {},
                   bool exact = true, int64_t offset = 0, int32_t task = 0) {
  SaveRequest request{session, exact, offset, chain(t, offset), 0, task};
  STRATA_ASSIGN_OR_RETURN(SaveTicket ticket, store.begin_save(request));
  for (size_t i = 0; i < ticket.destinations.size(); ++i) {
    fill(ticket.destinations[i], request.chain[ticket.first_chunk + i]);
  }
  store.commit_save(std::move(ticket), nullptr, 0);
  return Status();
}

// Loads every matched chunk of `prompt` and checks its bytes; returns the match.
inline std::optional<StoreMatch> load_and_check(KvStore& store, std::span<const TokenId> prompt,
                                         TierIndex* served = nullptr) {
  std::optional<StoreMatch> m = store.find(prompt, root(), {});
  if (!m) return m;
  StatusOr<StoreLease> lease = store.acquire(m->item, 0, m->num_chunks);
  EXPECT_TRUE(lease.ok()) << lease.status().to_string();
  if (!lease.ok()) return std::nullopt;
  const std::vector<kv::ChunkHash> hashes = chain(prompt);
  for (int64_t i = 0; i < m->num_chunks; ++i) {
    EXPECT_TRUE(holds(lease->chunks[i], hashes[i])) << "chunk " << i << " has the wrong bytes";
  }
  if (served) *served = lease->served_from;
  store.release(*lease, 0);
  return m;
}

}  // namespace strata::store
