// StoreOptions: built from a deployment's kv_store section, and checked before the store opens.
#include <algorithm>
#include <string>

#include "strata/store/kv_store.h"

namespace strata::store {

StoreOptions StoreOptions::from_config(const StoreConfig& config) {
  StoreOptions o;
  o.dram_bytes = config.dram_bytes;
  if (!config.ssd_dir.empty() && config.ssd_bytes > 0) {
    o.tiers.push_back({.name = "ssd",
                       .dir = config.ssd_dir,
                       .capacity_bytes = config.ssd_bytes,
                       .file_bytes = config.ssd_file_bytes,
                       .direct_io = config.direct_io,
                       .codec = config.ssd_codec,
                       .bandwidth_limit = config.ssd_bandwidth_limit,
                       .required = true});
  }
  if (config.remote.enabled()) {
    const RemoteTierConfig& r = config.remote;
    o.remote = RedisOptions{.name = "remote",
                            .address = r.address,
                            .username = r.username,
                            .password_env = r.password_env,
                            .database = r.database,
                            .capacity_bytes = r.bytes,
                            .max_item_bytes = r.max_item_bytes,
                            .timeout = std::chrono::milliseconds(r.timeout_ms),
                            .retry_after = std::chrono::milliseconds(r.retry_ms),
                            .ttl = std::chrono::seconds(r.ttl_seconds),
                            .codec = r.codec};
  }
  o.policy = config.eviction_policy;
  o.io_threads = config.io_threads;
  o.ttl = std::chrono::seconds(config.ttl_seconds);
  o.dram_reserve_fraction = config.dram_reserve_fraction;
  return o;
}

Status StoreOptions::validate() const {
  if (chunk_bytes <= 0) return invalid_argument_error("store: chunk size must be positive");
  if (block_size_tokens <= 0) return invalid_argument_error("store: block size must be positive");
  if (chunk_layers <= 0 || chunk_bytes % chunk_layers != 0) {
    return invalid_argument_error("store: a chunk's " + std::to_string(chunk_bytes) +
                                  " bytes do not split into " + std::to_string(chunk_layers) +
                                  " layers");
  }
  const int64_t chunk = round_up_to_page(chunk_bytes);
  if (dram_bytes < chunk) {
    return invalid_argument_error("store.dram_bytes must hold at least one chunk (" +
                                  std::to_string(chunk) + " bytes), got " + std::to_string(dram_bytes));
  }
  if (std::ssize(tiers) + 1 + (remote ? 1 : 0) > kMaxTiers) {
    return invalid_argument_error("store: at most " + std::to_string(kMaxTiers - 1) +
                                  " tiers below DRAM");
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    const SsdOptions& t = tiers[i];
    for (size_t j = 0; j < i; ++j) {
      if (tiers[j].name == t.name || tiers[j].dir == t.dir) {
        return invalid_argument_error("store: two lower tiers share the name or directory of '" +
                                      t.name + "'");
      }
    }
    if (t.name.empty() || t.name == "dram" || t.name == "gpu") {
      return invalid_argument_error("store: a lower tier needs its own name, got '" + t.name + "'");
    }
    if (t.bandwidth_limit < 0) {
      return invalid_argument_error("store: tier '" + t.name + "' has a negative bandwidth limit");
    }
    if (t.capacity_bytes <= 0 || t.dir.empty()) {
      return invalid_argument_error("store." + t.name + ": set a directory and a positive capacity");
    }
  }
  if (remote) {
    const RedisOptions& r = *remote;
    for (const SsdOptions& t : tiers) {
      if (t.name == r.name) {
        return invalid_argument_error("store: two lower tiers are named '" + r.name + "'");
      }
    }
    if (r.name.empty() || r.name == "dram" || r.name == "gpu") {
      return invalid_argument_error("store: the remote tier needs its own name, got '" + r.name + "'");
    }
    if (r.address.empty() || r.capacity_bytes <= 0 || r.max_item_bytes <= 0 ||
        r.timeout.count() <= 0 || r.retry_after.count() < 0 || r.ttl.count() < 0) {
      return invalid_argument_error("store." + r.name +
                                    ": set an address, a positive capacity, item size and timeout");
    }
    if (adaptcache.enabled) {
      return invalid_argument_error("store.adaptcache: not available with a remote tier yet");
    }
  }
  if (!(dram_reserve_fraction >= 0 && dram_reserve_fraction <= 0.9)) {
    return invalid_argument_error("store.dram_reserve_fraction must be in [0, 0.9], got " +
                                  std::to_string(dram_reserve_fraction));
  }
  if (io_threads < 1) return invalid_argument_error("store.io_threads must be >= 1");
  for (size_t i = 0; i < codecs.size(); ++i) {
    const ItemCodec& c = codecs[i];
    if (c.chunk_bytes <= 0 || c.chunk_bytes > chunk_bytes || !(c.quality <= 1) ||
        c.decode_seconds_per_byte < 0 || !(c.keep_fraction > 0 && c.keep_fraction <= 1) ||
        c.merged_pairs < 0 || (c.keep_fraction < 1 && c.chunk_bytes != chunk_bytes)) {
      return invalid_argument_error(
          "store: codec '" + c.name +
          "' needs 0 < bytes <= a raw chunk's (raw when it drops tokens), a quality <= 1 (< 0: "
          "not profiled), a keep fraction in (0, 1]");
    }
    for (size_t j = 0; j < i; ++j) {
      if (codecs[j].name == c.name) return invalid_argument_error("store: codec '" + c.name + "' twice");
    }
    if (!c.task_quality.empty() && c.task_quality.size() != adaptcache.tasks.size()) {
      return invalid_argument_error("store: codec '" + c.name + "' has " +
                                    std::to_string(c.task_quality.size()) + " task qualities for " +
                                    std::to_string(adaptcache.tasks.size()) + " task families");
    }
    for (double q : c.task_quality) {
      if (!(q >= 0 && q <= 1)) {
        return invalid_argument_error("store: codec '" + c.name +
                                      "' has a task quality outside [0, 1]");
      }
    }
  }
  if (codecs.size() > 1 && !transcode) {
    return invalid_argument_error("store: lossy codecs need a transcode function");
  }
  if (std::ranges::any_of(codecs, [](const ItemCodec& c) { return c.heavy_hitters; }) &&
      !keep_heavy_hitters) {
    return invalid_argument_error("store: an H2O codec needs a keep_heavy_hitters function");
  }
  if (fixed_codec < 0 || fixed_codec >= std::ssize(codecs) || (fixed_codec > 0 && adaptcache.enabled)) {
    return invalid_argument_error("store: fixed_codec names no codec, or is set beside adaptcache");
  }
  if (adaptcache.enabled) {
    const size_t n = tiers.size() + 1;
    if (adaptcache.bandwidth.size() != n || adaptcache.latency_seconds.size() != n) {
      return invalid_argument_error("store.adaptcache: one bandwidth and one latency per tier (" +
                                    std::to_string(n) + ")");
    }
    for (size_t i = 0; i < n; ++i) {
      if (!(adaptcache.bandwidth[i] > 0) || !(adaptcache.latency_seconds[i] >= 0)) {
        return invalid_argument_error("store.adaptcache: bandwidths > 0, latencies >= 0");
      }
    }
    if (!(adaptcache.half_life_seconds > 0) || !(adaptcache.alpha >= 0) ||
        !(adaptcache.prefill_seconds_per_token >= 0)) {
      return invalid_argument_error(
          "store.adaptcache: half_life_seconds > 0, alpha >= 0, prefill_seconds_per_token >= 0");
    }
  }
  if (ttl.count() < 0) return invalid_argument_error("store.ttl_seconds must be >= 0");
  return Status();
}

}  // namespace strata::store
