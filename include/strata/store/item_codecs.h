// Lossy codecs of whole stored items (AdaptCache, docs/adaptcache.md). An item's chunks all
// take one codec: "none" (the raw chunk the device writes) or a KIVI encoding (keys per channel,
// values per token, at 8, 4 or 2 bits), which the store's I/O threads apply in DRAM and which
// every tier then holds (a tier's own codec, zstd, applies on top). Loads hand the encoded chunks
// to the executor, which decodes them on the device, so only the encoded bytes cross to it.
//
// Which codec and tier an item takes: a fixed codec for every item (the static baselines), or
// AdaptCache's utility greedy (store/adaptcache_policy.h) over every item, run whenever DRAM
// falls below its reserve. Plain header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "strata/common/status.h"

namespace strata::store {

struct ItemCodec {
  std::string name;         // "none", "kivi-4": persisted with the values
  int64_t chunk_bytes = 0;  // one chunk, encoded
  double quality = 1.0;     // AdaptCache's Q of this codec (the profile), in [0, 1]
  double decode_seconds_per_byte = 0;  // restoring one raw byte (the profile)
};

// Re-encodes chunk values from codec `from` to codec `to` (indices into StoreOptions::codecs):
// in[i] (codecs[from].chunk_bytes each) -> out[i] (codecs[to].chunk_bytes each). Set by the
// executor, which knows the chunk layout; called on the store's I/O threads.
using Transcode = std::function<Status(int32_t from, int32_t to, std::span<const std::byte* const> in,
                                       std::span<std::byte* const> out)>;

struct AdaptCacheOptions {
  bool enabled = false;
  double alpha = 1.0;               // seconds of delay one unit of quality is worth
  double half_life_seconds = 600;   // of an item's decayed reuse count
  double prefill_seconds_per_token = 1e-3;  // recomputing instead of loading (evict's delay)
  // Per tier, DRAM first: bytes per second to the device and a fixed latency (the profile).
  std::vector<double> bandwidth;
  std::vector<double> latency_seconds;
};

}  // namespace strata::store
