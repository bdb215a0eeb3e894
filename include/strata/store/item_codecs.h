// Lossy codecs of whole stored items (AdaptCache, docs/adaptcache.md). An item's chunks all
// take one codec: "none" (the raw chunk the device writes), a KIVI encoding (keys per channel,
// values per token, at 8, 4 or 2 bits), or StreamingLLM token dropping (chunk 0, the attention
// sinks, and the most recent chunks, the window, kept raw; the middle dropped), which the store's
// I/O threads apply in DRAM and which every tier then holds (a tier's own codec, zstd, applies on
// top), or Krul's layer merge (each of the conversation's layer pairs, chosen at its turn end,
// stored once as one merged KV: docs/krul.md), or H2O (each layer and KV head keeps the tokens
// that received the most attention over the conversation's turn, and the recent half: Krul's H2O
// baseline, docs/krul.md decision 11). Loads hand KIVI chunks to the executor, which
// decodes them on the device, so only the encoded bytes cross to it; merged chunks are restored
// to raw ones on the host first; a token-dropped item is loaded like a truncated one (its keys,
// stored before RoPE, are rotated to contiguous positions).
//
// Which codec and tier an item takes: a fixed codec for every item (the static baselines), or
// AdaptCache's utility greedy (store/adaptcache_policy.h) over every item, run whenever DRAM
// falls below its reserve. Plain header.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"
#include "strata/kv/krul_policy.h"

namespace strata::store {

// The lossy codecs a deployment may name, in the store's order after "none".
struct KnownItemCodec {
  std::string_view name;
  int kivi_bits = 0;           // KIVI at this many bits, or 0
  double keep_fraction = 1.0;  // token dropping: the share of chunks kept, or 1
  bool layer_merge = false;    // Krul's merged layer pairs
  bool heavy_hitters = false;  // H2O: keep_fraction of the tokens, chosen per layer and KV head
};
inline constexpr KnownItemCodec kItemCodecs[] = {
    {"kivi-8", 8, 1.0},
    {"kivi-4", 4, 1.0},
    {"kivi-2", 2, 1.0},
    {"streaming-0.5", 0, 0.5},
    {"streaming-0.25", 0, 0.25},
    {"streaming-0.1", 0, 0.1},
    {"layer-merge", 0, 1.0, true},
    {"h2o-0.5", 0, 0.5, false, true},
    {"h2o-0.25", 0, 0.25, false, true},
};
inline constexpr std::string_view kItemCodecChoices =
    "none, kivi-8, kivi-4, kivi-2, streaming-0.5, streaming-0.25, streaming-0.1, layer-merge, "
    "h2o-0.5 or h2o-0.25";

// Whether `name` is one of the H2O codecs (KnownItemCodec::heavy_hitters).
inline bool heavy_hitter_codec(std::string_view name) {
  return std::ranges::any_of(
      kItemCodecs, [&](const KnownItemCodec& c) { return c.heavy_hitters && c.name == name; });
}

struct ItemCodec {
  std::string name;         // "none", "kivi-4", "streaming-0.25": persisted with the values
  int64_t chunk_bytes = 0;  // one chunk, encoded
  // AdaptCache's Q of this codec (the profile), in [0, 1]; < 0: not profiled, not an option.
  // It serves items of no task family; task_quality below those of a family.
  double quality = 1.0;
  double decode_seconds_per_byte = 0;  // restoring one raw byte (the profile)
  // Token dropping and H2O: the share of an item's chunks kept (kept_chunks); 1 for the others.
  double keep_fraction = 1.0;
  // H2O: the kept chunks hold every layer and KV head's heavy hitters and recent tokens
  // (KeepHeavyHitters), chosen over the whole item; the item takes it only with the attention
  // its conversation's last turn observed (Item::token_mass).
  bool heavy_hitters = false;
  // Layer merge: the layer pairs each chunk merges (an item takes it only when its conversation
  // has that many: Item::layer_pairs); 0 for the other codecs.
  int32_t merged_pairs = 0;
  // task_quality[t]: Q for items of AdaptCacheOptions::tasks[t] (empty: `quality` for all).
  std::vector<double> task_quality;
};

// The chunks a codec keeping `keep_fraction` of an item keeps, of the `original` chunks the item
// had before any were dropped: ceil(keep_fraction * original), at least 2 (the sinks' chunk and
// one of the window), at most original.
inline int64_t kept_chunks(double keep_fraction, int64_t original) {
  if (keep_fraction >= 1) return original;
  const auto kept =
      static_cast<int64_t>(std::ceil(keep_fraction * static_cast<double>(original) - 1e-9));
  return std::min(original, std::max<int64_t>(2, kept));
}

// Re-encodes chunk values from codec `from` to `to` (indices into StoreOptions::codecs; token
// dropping needs no re-encoding) of an item whose conversation's layer pairs are `pairs` (what a
// layer merge merges): in[i] (codecs[from].chunk_bytes each) -> out[i] (codecs[to].chunk_bytes
// each). Set by the executor, which knows the chunk layout; called on the store's I/O threads.
using Transcode =
    std::function<Status(int32_t from, int32_t to, const std::vector<kv::krul::LayerPair>& pairs,
                         std::span<const std::byte* const> in, std::span<std::byte* const> out)>;

// H2O's stored form of an item's n raw chunks in[i] -> out.size() kept chunks, chosen by
// token_mass, the attention each of its tokens received (kv::krul::AttentionStats::token_mass).
// Set by the executor (Executor::keep_heavy_hitters); called on the store's I/O threads.
using KeepHeavyHitters =
    std::function<Status(std::span<const float> token_mass, std::span<const std::byte* const> in,
                         std::span<std::byte* const> out)>;

struct AdaptCacheOptions {
  bool enabled = false;
  double alpha = 1.0;               // seconds of delay one unit of quality is worth
  double half_life_seconds = 600;   // of an item's decayed reuse count
  double prefill_seconds_per_token = 1e-3;  // recomputing instead of loading (evict's delay)
  // Per tier, DRAM first: bytes per second to the device and a fixed latency (the profile).
  std::vector<double> bandwidth;
  std::vector<double> latency_seconds;
  // The task families the profile has quality curves for (a request names its family: kv_task);
  // an item's task is 0 for none, t + 1 for tasks[t].
  std::vector<std::string> tasks;

  // The item task of a request's family: 0 for "", t + 1 for tasks[t], -1 for a name the profile
  // does not list.
  int32_t task_index(std::string_view name) const {
    if (name.empty()) return 0;
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (tasks[t] == name) return static_cast<int32_t>(t + 1);
    }
    return -1;
  }
};

}  // namespace strata::store
