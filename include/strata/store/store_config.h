// The KV store's configuration as the deployment file's kv_store section writes it
// (config::KvStoreSection derives from it and adds validation): a DRAM tier, optionally an SSD
// tier and a remote (Redis) tier below it, the placement policy and the read buffer. KvStore takes it through
// StoreOptions::from_config. Plain header.
#pragma once

#include <cstdint>
#include <string>

#include "strata/store/codec.h"
#include "strata/store/placement_policy.h"

namespace strata::store {

// AdaptCache (docs/adaptcache.md), the deployment file's adaptcache section: lossy codecs for
// stored items (KIVI at 8, 4 or 2 bits).
struct AdaptCacheConfig {
  bool enabled = false;  // each item's codec and tier by utility (needs `profile`)
  // With enabled false: "none", or kivi-8 | kivi-4 | kivi-2 for every item (static baselines).
  std::string fixed_codec = "none";
  double alpha = 1.0;               // seconds of delay one unit of quality is worth
  double half_life_seconds = 600;   // of an item's decayed reuse count
  // A JSON profile of this model on this machine (codec qualities and decode costs, tier
  // bandwidths, prefill rate): bench/adaptcache_report.py --profile-out writes it.
  std::string profile;

  bool operator==(const AdaptCacheConfig&) const = default;
};

// The remote tier (store/redis_tier.h): a Redis server replicas share, below every other tier.
// The deployment file's kv_store.remote_* keys.
struct RemoteTierConfig {
  std::string address;       // host:port or unix:/path; "": no remote tier
  std::string username;      // ACL user; "": the default user
  std::string password_env;  // environment variable holding the password; "": no AUTH
  int32_t database = 0;      // SELECT, in [0, 15] on a default server
  int64_t bytes = int64_t{1} << 30;              // what this replica indexes there
  int64_t max_item_bytes = int64_t{256} << 20;   // larger conversations are not written
  int32_t timeout_ms = 200;  // connect and each socket read or write; a request waits at most this
  int32_t retry_ms = 1000;   // after a failure, the tier is skipped this long
  int64_t ttl_seconds = 3600;  // of every key, renewed by reads; 0: none (the server's policy)
  CodecKind codec = CodecKind::kIdentity;

  bool enabled() const { return !address.empty(); }
  bool operator==(const RemoteTierConfig&) const = default;
};

// How a resumed turn gets its stored history's KV into the device pool (docs/krul.md).
enum class RestoreMode {
  kLoad,     // load every stored block (CachedAttention)
  kKrul,     // Krul's pyramid: each layer recomputes a prefix, never longer than the layer
             // above's, sized so recomputing and loading take equal time (measured costs)
  kPartial,  // every layer recomputes the same share of the history (recompute_ratio): the
             // fixed-ratio partial-recompute baseline
};
inline const char* restore_mode_name(RestoreMode mode) {
  switch (mode) {
    case RestoreMode::kLoad: return "load";
    case RestoreMode::kKrul: return "krul";
    case RestoreMode::kPartial: return "partial";
  }
  return "unknown";
}

// Krul's cross-layer sharing (docs/krul.md): at each turn end the layer pairs of a conversation
// whose stored KV the layer-merge codec (fixed_codec or AdaptCache) keeps once per pair.
enum class LayerPairing {
  kNone,       // no pairs: no item takes the layer merge
  kKrul,       // Krul: I-R layers paired by the distance of their attention (observed per turn)
  kMiniCache,  // MiniCache's fixed pairs: adjacent layers from the deep end
};
inline const char* layer_pairing_name(LayerPairing pairing) {
  switch (pairing) {
    case LayerPairing::kNone:
      return "none";
    case LayerPairing::kKrul:
      return "krul";
    case LayerPairing::kMiniCache:
      return "minicache";
  }
  return "unknown";
}

struct StoreConfig {
  int64_t dram_bytes = 0;  // DRAM tier capacity; 0 disables the whole store
  // The SSD tier: a directory (relative paths are relative to the process's working directory)
  // and its capacity; "" and 0: no SSD tier. With the store on, set both or neither.
  std::string ssd_dir;
  int64_t ssd_bytes = 0;
  int64_t ssd_file_bytes = int64_t{1} << 30;  // one preallocated data file; >= 1MiB
  bool direct_io = true;  // O_DIRECT; buffered I/O where the file system refuses it
  // Bytes per second the SSD tier moves at most, reads and writes together: an emulated slower
  // disk for measurements (store/env.h throttled_env); 0: as fast as the disk.
  int64_t ssd_bandwidth_limit = 0;
  // How the SSD tier stores chunks: identity (as they are) or zstd (lossless, fewer bytes).
  CodecKind ssd_codec = CodecKind::kIdentity;
  EvictionPolicy eviction_policy = EvictionPolicy::kSchedulerAware;
  int32_t io_threads = 2;      // in [1, 64]
  int64_t ttl_seconds = 3600;  // items unused this long leave the store; 0: never
  // Share of DRAM the I/O threads keep free for saves and prefetches, in [0, 0.9].
  double dram_reserve_fraction = 0.1;
  // Layers of the next waiting request's stored KV copied to the device while the current pass
  // runs (CachedAttention's read buffer): -1 sized per request from the measured load and prefill
  // times (store::read_buffer_layers), 0 off (layer-wise loading within the pass only), n fixed.
  int32_t read_buffer_layers = -1;
  RestoreMode restore_mode = RestoreMode::kLoad;
  double recompute_ratio = 0.25;  // kPartial: the share of the history every layer recomputes
  // kKrul: Krul's stored form (docs/krul.md decision 12): each stored chunk keeps below DRAM only
  // the layers the conversation's turn-end restoration plan loads (the others it recomputes).
  bool stored_suffix = false;
  LayerPairing layer_pairing = LayerPairing::kNone;
  double layer_share = 0.5;    // of all layers, paired (Krul's P/N)
  double krul_gamma = 0.65;    // the I-R detector's threshold on the edge share (kKrul)
  // kKrul: the attention rows observed are those at positions that are multiples of this (1: all)
  int32_t krul_row_stride = 8;
  double merge_retain = 0.05;  // MiniCache's retention: the top share of each chunk's angle range
  AdaptCacheConfig adaptcache;
  RemoteTierConfig remote;

  bool enabled() const { return dram_bytes > 0; }
  bool operator==(const StoreConfig&) const = default;
};

}  // namespace strata::store
