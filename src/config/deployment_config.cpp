#include "strata/config/deployment_config.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "key_checks.h"
#include "strata/store/item_codecs.h"

namespace strata::config {
namespace {

const KeyCheck<ModelSection> kModelKeys[] = {
    {"model.path",
     [](const ModelSection& m) {
       if (!m.path.empty()) return Status();
       return invalid_argument_error("model.path is required (a .gguf file or a model directory)");
     }},
    {"model.dtype", nullptr},
    {"model.weights", nullptr},
    {"model.chat_template", nullptr},
    {"model.chat_template_file", nullptr},
    {"model.served_name",
     [](const ModelSection& m) {
       if (!has_space_or_control(m.served_name)) return Status();
       return invalid_argument_error(
           "model.served_name must not contain spaces or control characters, got '" +
           m.served_name + "'");
     }},
};

const KeyCheck<DevicesSection> kDevicesKeys[] = {
    {"devices.device",
     [](const DevicesSection& d) {
       if (d.device.index < 0) {
         return invalid_argument_error("devices.device: the CUDA device index must be >= 0, got " +
                                       std::to_string(d.device.index));
       }
       if (d.device.kind != DeviceKind::kCuda && d.device.index != 0) {
         return invalid_argument_error(
             "devices.device: a CUDA device index (" + std::to_string(d.device.index) +
             ") needs device cuda, got " + std::string(config_name(d.device.kind)));
       }
       return Status();
     }},
    {"devices.tensor_parallel_size",
     [](const DevicesSection& d) {
       return at_least("devices.tensor_parallel_size", d.tensor_parallel_size, 1);
     }},
    {"devices.nodes", [](const DevicesSection& d) { return at_least("devices.nodes", d.nodes, 1); }},
    {"devices.node_rank",
     [](const DevicesSection& d) { return at_least("devices.node_rank", d.node_rank, 0); }},
    {"devices.master_address",
     [](const DevicesSection& d) {
       return d.master_address.empty()
                  ? invalid_argument_error("devices.master_address must not be empty")
                  : Status();
     }},
    {"devices.master_port",
     [](const DevicesSection& d) {
       return d.master_port < 0 || d.master_port > 65535
                  ? invalid_argument_error("devices.master_port must be in [0, 65535], got " +
                                           std::to_string(d.master_port))
                  : Status();
     }},
    {"devices.collective_timeout_seconds",
     [](const DevicesSection& d) {
       return at_least("devices.collective_timeout_seconds", d.collective_timeout_seconds, 1);
     }},
    {"devices.cpu_threads",
     [](const DevicesSection& d) { return at_least("devices.cpu_threads", d.cpu_threads, 0); }},
};

const KeyCheck<ExecutorSection> kExecutorKeys[] = {
    {"executor.kernels", nullptr},
};

const KeyCheck<KvCacheSection> kKvCacheKeys[] = {
    {"kv_cache.block_size_tokens",
     [](const KvCacheSection& k) {
       const int32_t n = k.block_size_tokens;
       if (n >= 1 && n <= 256 && (n & (n - 1)) == 0) return Status();
       return invalid_argument_error(
           "kv_cache.block_size_tokens must be a power of two in [1, 256], got " +
           std::to_string(n));
     }},
    {"kv_cache.gpu_memory_fraction",
     [](const KvCacheSection& k) {
       // Written so that NaN fails too.
       if (!k.gpu_memory_fraction || (*k.gpu_memory_fraction > 0 && *k.gpu_memory_fraction <= 1)) {
         return Status();
       }
       return invalid_argument_error("kv_cache.gpu_memory_fraction must be in (0, 1], got " +
                                     format_number(*k.gpu_memory_fraction));
     }},
    {"kv_cache.cache_bytes",
     [](const KvCacheSection& k) {
       return k.cache_bytes ? at_least("kv_cache.cache_bytes", *k.cache_bytes, 1) : Status();
     }},
    {"kv_cache.host_cache_bytes",
     [](const KvCacheSection& k) {
       return at_least("kv_cache.host_cache_bytes", k.host_cache_bytes, 0);
     }},
    {"kv_cache.enable_prefix_caching", nullptr},
    {"kv_cache.page_format", nullptr},  // checked against the model when the pool is built
    {"kv_cache.page_blocks",
     [](const KvCacheSection& k) {
       return in_range("kv_cache.page_blocks", k.page_blocks, 0, 64);
     }},
    {"kv_cache.max_context_tokens",
     [](const KvCacheSection& k) {
       return at_least("kv_cache.max_context_tokens", k.max_context_tokens, 0);
     }},
};

const KeyCheck<KvStoreSection> kKvStoreKeys[] = {
    {"kv_store.dram_bytes",
     [](const KvStoreSection& k) {
       return bytes_at_least("kv_store.dram_bytes", k.dram_bytes, 0);
     }},
    {"kv_store.ssd_dir",
     [](const KvStoreSection& k) {
       if (!has_control(k.ssd_dir)) return Status();
       return invalid_argument_error("kv_store.ssd_dir must not contain control characters");
     }},
    {"kv_store.ssd_bytes",
     [](const KvStoreSection& k) { return bytes_at_least("kv_store.ssd_bytes", k.ssd_bytes, 0); }},
    {"kv_store.ssd_file_bytes",
     [](const KvStoreSection& k) {
       return bytes_at_least("kv_store.ssd_file_bytes", k.ssd_file_bytes, int64_t{1} << 20);
     }},
    {"kv_store.direct_io", nullptr},
    {"kv_store.ssd_bandwidth_limit",
     [](const KvStoreSection& k) {
       return bytes_at_least("kv_store.ssd_bandwidth_limit", k.ssd_bandwidth_limit, 0);
     }},
    {"kv_store.ssd_codec", nullptr},
    {"kv_store.eviction_policy", nullptr},
    {"kv_store.io_threads",
     [](const KvStoreSection& k) { return in_range("kv_store.io_threads", k.io_threads, 1, 64); }},
    {"kv_store.ttl_seconds",
     [](const KvStoreSection& k) { return at_least("kv_store.ttl_seconds", k.ttl_seconds, 0); }},
    {"kv_store.dram_reserve_fraction",
     [](const KvStoreSection& k) {
       return number_in("kv_store.dram_reserve_fraction", k.dram_reserve_fraction, 0, 0.9);
     }},
    {"kv_store.read_buffer_layers",
     [](const KvStoreSection& k) {
       return in_range("kv_store.read_buffer_layers", k.read_buffer_layers, -1, 1024);
     }},
    {"kv_store.restore_mode", nullptr},
    {"kv_store.recompute_ratio",
     [](const KvStoreSection& k) {
       return number_in("kv_store.recompute_ratio", k.recompute_ratio, 0, 1);
     }},
    {"kv_store.stored_suffix", nullptr},
    {"kv_store.layer_pairing", nullptr},
    {"kv_store.layer_share",
     [](const KvStoreSection& k) {
       if (k.layer_share > 0 && k.layer_share <= 1) return Status();
       return invalid_argument_error("kv_store.layer_share must be in (0, 1], got " +
                                     format_number(k.layer_share));
     }},
    {"kv_store.krul_gamma",
     [](const KvStoreSection& k) { return number_in("kv_store.krul_gamma", k.krul_gamma, 0, 1); }},
    {"kv_store.krul_row_stride",
     [](const KvStoreSection& k) {
       return number_in("kv_store.krul_row_stride", k.krul_row_stride, 1, 4096);
     }},
    {"kv_store.merge_retain",
     [](const KvStoreSection& k) {
       return number_in("kv_store.merge_retain", k.merge_retain, 0, 1);
     }},
    {"kv_store.adaptcache",
     [](const KvStoreSection& k) {
       if (!k.adaptcache.enabled || !k.adaptcache.profile.empty()) return Status();
       return invalid_argument_error("kv_store.adaptcache needs kv_store.adaptcache_profile");
     }},
    {"kv_store.fixed_codec",
     [](const KvStoreSection& k) {
       const std::string& c = k.adaptcache.fixed_codec;
       if (c == "none" ||
           std::ranges::any_of(store::kItemCodecs, [&](const store::KnownItemCodec& known) {
             return known.name == c;
           })) {
         if (c == "none" || !k.adaptcache.enabled) return Status();
         return invalid_argument_error("kv_store.fixed_codec is a baseline: set it with adaptcache off");
       }
       return invalid_argument_error("kv_store.fixed_codec must be " +
                                     std::string(store::kItemCodecChoices) + ", got '" + c + "'");
     }},
    {"kv_store.adaptcache_alpha",
     [](const KvStoreSection& k) {
       if (k.adaptcache.alpha >= 0) return Status();
       return invalid_argument_error("kv_store.adaptcache_alpha must be >= 0, got " +
                                     format_number(k.adaptcache.alpha));
     }},
    {"kv_store.adaptcache_half_life_seconds",
     [](const KvStoreSection& k) {
       if (k.adaptcache.half_life_seconds > 0) return Status();
       return invalid_argument_error("kv_store.adaptcache_half_life_seconds must be > 0, got " +
                                     format_number(k.adaptcache.half_life_seconds));
     }},
    {"kv_store.adaptcache_profile", nullptr},
    {"kv_store.remote_address",
     [](const KvStoreSection& k) {
       const std::string& a = k.remote.address;
       const bool unix_socket = a.starts_with("unix:") && a.size() > 5;
       const size_t colon = a.rfind(':');
       if (a.empty() || (!has_control(a) && (unix_socket || (colon != std::string::npos &&
                                                              colon > 0 && colon + 1 < a.size())))) {
         return Status();
       }
       return invalid_argument_error("kv_store.remote_address must be host:port or unix:/path, got '" +
                                     (has_control(a) ? std::string("(control characters)") : a) +
                                     "'");
     }},
    {"kv_store.remote_username",
     [](const KvStoreSection& k) {
       if (!has_control(k.remote.username)) return Status();
       return invalid_argument_error("kv_store.remote_username must not contain control characters");
     }},
    {"kv_store.remote_password_env",
     [](const KvStoreSection& k) {
       for (char c : k.remote.password_env) {
         if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
           return invalid_argument_error(
               "kv_store.remote_password_env must be an environment variable's name ([A-Za-z0-9_])");
         }
       }
       return Status();
     }},
    {"kv_store.remote_database",
     [](const KvStoreSection& k) {
       return in_range("kv_store.remote_database", k.remote.database, 0, 1 << 20);
     }},
    {"kv_store.remote_bytes",
     [](const KvStoreSection& k) {
       return bytes_at_least("kv_store.remote_bytes", k.remote.bytes, int64_t{1} << 20);
     }},
    {"kv_store.remote_max_item_bytes",
     [](const KvStoreSection& k) {
       return bytes_at_least("kv_store.remote_max_item_bytes", k.remote.max_item_bytes, int64_t{1} << 20);
     }},
    {"kv_store.remote_timeout_ms",
     [](const KvStoreSection& k) {
       return in_range("kv_store.remote_timeout_ms", k.remote.timeout_ms, 1, 60000);
     }},
    {"kv_store.remote_retry_ms",
     [](const KvStoreSection& k) {
       return in_range("kv_store.remote_retry_ms", k.remote.retry_ms, 0, 600000);
     }},
    {"kv_store.remote_ttl_seconds",
     [](const KvStoreSection& k) {
       return at_least("kv_store.remote_ttl_seconds", k.remote.ttl_seconds, 0);
     }},
    {"kv_store.remote_codec", nullptr},
};

const KeyCheck<FreeKvSection> kFreeKvKeys[] = {
    {"freekv.enabled", nullptr},
    {"freekv.method",
     [](const FreeKvSection& f) {
       if (f.method != FreeKvMethod::kH2o ||
           (f.window_tokens >= 1 && f.budget_tokens > f.window_tokens)) {
         return Status();
       }
       return invalid_argument_error(
           "freekv.method h2o needs window_tokens >= 1 and budget_tokens (" +
           std::to_string(f.budget_tokens) + ") above window_tokens (" +
           std::to_string(f.window_tokens) + ")");
     }},
    {"freekv.page_tokens",
     [](const FreeKvSection& f) { return in_range("freekv.page_tokens", f.page_tokens, 1, 1024); }},
    {"freekv.budget_tokens",
     [](const FreeKvSection& f) {
       if (f.budget_tokens >= f.sink_tokens + f.window_tokens) return Status();
       return invalid_argument_error(
           "freekv.budget_tokens (" + std::to_string(f.budget_tokens) +
           ") must be at least freekv.sink_tokens + freekv.window_tokens (equal: StreamingLLM, "
           "no page selected)");
     }},
    {"freekv.sink_tokens",
     [](const FreeKvSection& f) {
       if (f.sink_tokens >= 0 && f.page_tokens > 0 && f.sink_tokens % f.page_tokens == 0) {
         return Status();
       }
       return invalid_argument_error("freekv.sink_tokens must be whole pages of freekv.page_tokens, got " +
                                     std::to_string(f.sink_tokens));
     }},
    {"freekv.window_tokens",
     [](const FreeKvSection& f) {
       if (f.window_tokens >= 0 && f.page_tokens > 0 && f.window_tokens % f.page_tokens == 0) {
         return Status();
       }
       return invalid_argument_error(
           "freekv.window_tokens must be whole pages of freekv.page_tokens, got " +
           std::to_string(f.window_tokens));
     }},
    {"freekv.tau", [](const FreeKvSection& f) { return number_in("freekv.tau", f.tau, -1, 2); }},
    {"freekv.min_context_tokens",
     [](const FreeKvSection& f) {
       if (f.min_context_tokens >= f.budget_tokens) return Status();
       return invalid_argument_error("freekv.min_context_tokens (" +
                                     std::to_string(f.min_context_tokens) +
                                     ") must be at least freekv.budget_tokens (" +
                                     std::to_string(f.budget_tokens) + ")");
     }},
    {"freekv.host_bytes",
     [](const FreeKvSection& f) {
       return bytes_at_least("freekv.host_bytes", f.host_bytes, int64_t{1} << 20);
     }},
};

Status valid_bits(std::string_view key, int32_t bits) {
  if (bits == 8 || bits == 4 || bits == 2) return Status();
  return invalid_argument_error(std::string(key) + " must be 8, 4 or 2, got " + std::to_string(bits));
}

const KeyCheck<LeanKvSection> kLeanKvKeys[] = {
    {"leankv.enabled", nullptr},
    {"leankv.alpha_high",
     [](const LeanKvSection& l) {
       if (l.alpha_high >= 0 && l.alpha_high < 1e6) return Status();  // NaN fails too
       return invalid_argument_error("leankv.alpha_high must be in [0, 1e6), got " +
                                     format_number(l.alpha_high));
     }},
    {"leankv.alpha_low",
     [](const LeanKvSection& l) {
       if (l.alpha_low >= 0 && l.alpha_low < 1e6) return Status();
       return invalid_argument_error("leankv.alpha_low must be in [0, 1e6), got " +
                                     format_number(l.alpha_low));
     }},
    {"leankv.window", [](const LeanKvSection& l) { return in_range("leankv.window", l.window, 1, 4096); }},
    {"leankv.high_key_bits",
     [](const LeanKvSection& l) { return valid_bits("leankv.high_key_bits", l.high_key_bits); }},
    {"leankv.high_value_bits",
     [](const LeanKvSection& l) { return valid_bits("leankv.high_value_bits", l.high_value_bits); }},
    {"leankv.low_key_bits",
     [](const LeanKvSection& l) { return valid_bits("leankv.low_key_bits", l.low_key_bits); }},
    {"leankv.low_value_bits",
     [](const LeanKvSection& l) { return valid_bits("leankv.low_value_bits", l.low_value_bits); }},
    {"leankv.high_tokens_per_page",
     [](const LeanKvSection& l) {
       return in_range("leankv.high_tokens_per_page", l.high_tokens_per_page, 8, 256);
     }},
    {"leankv.pool_bytes",
     [](const LeanKvSection& l) { return bytes_at_least("leankv.pool_bytes", l.pool_bytes, int64_t{1} << 20); }},
    {"leankv.max_sequences",
     [](const LeanKvSection& l) { return at_least("leankv.max_sequences", l.max_sequences, 1); }},
};

const KeyCheck<SchedulerSection> kSchedulerKeys[] = {
    {"scheduler.max_num_seqs",
     [](const SchedulerSection& s) {
       return at_least("scheduler.max_num_seqs", s.max_num_seqs, 1);
     }},
    {"scheduler.max_num_batched_tokens",
     [](const SchedulerSection& s) {
       return at_least("scheduler.max_num_batched_tokens", s.max_num_batched_tokens, 1);
     }},
    {"scheduler.preemption_mode", nullptr},
    {"scheduler.max_queued_requests",
     [](const SchedulerSection& s) {
       return at_least("scheduler.max_queued_requests", s.max_queued_requests, 1);
     }},
    {"scheduler.overflow_truncation_fraction",
     [](const SchedulerSection& s) {
       return number_in("scheduler.overflow_truncation_fraction", s.overflow_truncation_fraction, 0,
                        0.9);
     }},
};

const KeyCheck<ServerSection> kServerKeys[] = {
    {"server.host",
     [](const ServerSection& s) {
       if (!s.host.empty() && !has_space_or_control(s.host)) return Status();
       return invalid_argument_error(
           "server.host must be a non-empty address without spaces, got '" + s.host + "'");
     }},
    {"server.grpc_port",
     [](const ServerSection& s) { return port("server.grpc_port", s.grpc_port); }},
    {"server.http_port",
     [](const ServerSection& s) { return port("server.http_port", s.http_port); }},
    {"server.api_keys",
     [](const ServerSection& s) {
       for (size_t i = 0; i < s.api_keys.size(); ++i) {
         if (s.api_keys[i].empty() || has_space_or_control(s.api_keys[i])) {
           return invalid_argument_error("server.api_keys[" + std::to_string(i) +
                                         "] must be non-empty, without spaces or control "
                                         "characters");
         }
       }
       return Status();
     }},
    {"server.api_keys_env",
     [](const ServerSection& s) {
       if (s.api_keys_env.empty() || is_env_name(s.api_keys_env)) return Status();
       std::string message = "server.api_keys_env must be an environment variable name ";
       message += "([A-Za-z_][A-Za-z0-9_]*), got '" + s.api_keys_env + "'";
       return invalid_argument_error(std::move(message));
     }},
    {"server.shutdown_grace_seconds",
     [](const ServerSection& s) {
       return at_least("server.shutdown_grace_seconds", s.shutdown_grace_seconds, 0);
     }},
    {"server.request_timeout_seconds",
     [](const ServerSection& s) {
       return at_least("server.request_timeout_seconds", s.request_timeout_seconds, 0);
     }},
    {"server.max_connections",
     [](const ServerSection& s) {
       return at_least("server.max_connections", s.max_connections, 1);
     }},
};

const KeyCheck<SamplingSection> kSamplingKeys[] = {
    {"sampling.temperature", nullptr},
    {"sampling.top_k", nullptr},
    {"sampling.top_p", nullptr},
    {"sampling.min_p", nullptr},
    {"sampling.repetition_penalty", nullptr},
    {"sampling.presence_penalty", nullptr},
    {"sampling.frequency_penalty", nullptr},
    {"sampling.use_generation_config", nullptr},
};

const KeyCheck<LoggingSection> kLoggingKeys[] = {
    {"logging.level", nullptr},
    {"logging.format", nullptr},
};

}  // namespace

std::string ModelSection::effective_served_name() const {
  if (!served_name.empty()) return served_name;
  std::string_view name = path;
  while (name.size() > 1 && name.back() == '/') name.remove_suffix(1);
  if (const size_t slash = name.rfind('/'); slash != std::string_view::npos && name.size() > 1) {
    name.remove_prefix(slash + 1);
  }
  constexpr std::string_view kGguf = ".gguf";
  if (name.size() > kGguf.size() && name.ends_with(kGguf)) name.remove_suffix(kGguf.size());
  return std::string(name);
}

Status ModelSection::validate() const { return check_keys(kModelKeys, *this); }

Status DevicesSection::validate() const {
  STRATA_RETURN_IF_ERROR(check_keys(kDevicesKeys, *this));
  if (tensor_parallel_size % nodes != 0) {
    return invalid_argument_error("devices.tensor_parallel_size " +
                                  std::to_string(tensor_parallel_size) + " does not divide among " +
                                  std::to_string(nodes) + " devices.nodes");
  }
  if (node_rank >= nodes) {
    return invalid_argument_error("devices.node_rank " + std::to_string(node_rank) +
                                  " must be below devices.nodes " + std::to_string(nodes));
  }
  if (nodes > 1 && master_port == 0) {
    return invalid_argument_error(
        "devices.master_port: ranks on several machines meet at master_address:master_port; "
        "set it");
  }
  return Status();
}

std::string device_config_name(const DevicesSection& devices) {
  if (devices.device.kind == DeviceKind::kCuda && devices.device.index != 0) {
    return "cuda:" + std::to_string(devices.device.index);
  }
  return std::string(config_name(devices.device.kind));
}

Status KvCacheSection::validate() const {
  STRATA_RETURN_IF_ERROR(check_keys(kKvCacheKeys, *this));
  if (gpu_memory_fraction && cache_bytes) {
    return invalid_argument_error(
        "kv_cache.gpu_memory_fraction and kv_cache.cache_bytes are both set; set one of them");
  }
  return Status();
}

Status KvStoreSection::validate() const {
  STRATA_RETURN_IF_ERROR(check_keys(kKvStoreKeys, *this));
  if (!enabled()) return Status();  // the SSD keys mean nothing without the store
  if (!ssd_dir.empty() && ssd_bytes == 0) {
    return invalid_argument_error(
        "kv_store.ssd_bytes must be > 0 when kv_store.ssd_dir is set, got 0; set kv_store.ssd_dir "
        "to \"\" for no SSD tier");
  }
  if (ssd_dir.empty() && ssd_bytes > 0) {
    return invalid_argument_error("kv_store.ssd_bytes is " + format_byte_size(ssd_bytes) +
                                  " but kv_store.ssd_dir is not set; set kv_store.ssd_dir, or "
                                  "kv_store.ssd_bytes to 0 for no SSD tier");
  }
  if (remote.enabled() && adaptcache.enabled) {
    return invalid_argument_error(
        "kv_store.remote_address: AdaptCache does not place conversations in the remote tier yet; "
        "set kv_store.adaptcache to false or kv_store.remote_address to \"\"");
  }
  const bool merges = adaptcache.enabled || adaptcache.fixed_codec == "layer-merge";
  if (layer_pairing != LayerPairing::kNone && !merges) {
    return invalid_argument_error(
        "kv_store.layer_pairing pairs layers for the layer-merge codec: set kv_store.fixed_codec "
        "to layer-merge (or kv_store.adaptcache with a profile listing it)");
  }
  if (adaptcache.fixed_codec == "layer-merge" && layer_pairing == LayerPairing::kNone) {
    return invalid_argument_error(
        "kv_store.fixed_codec layer-merge needs kv_store.layer_pairing krul or minicache");
  }
  if (stored_suffix &&
      (restore_mode != store::RestoreMode::kKrul || adaptcache.enabled ||
       (adaptcache.fixed_codec != "none" && adaptcache.fixed_codec != "layer-merge") ||
       remote.enabled())) {
    return invalid_argument_error(
        "kv_store.stored_suffix stores what Krul's restoration loads: it needs "
        "kv_store.restore_mode krul, fixed_codec none or layer-merge, adaptcache false and no "
        "remote_address (docs/krul.md decision 12)");
  }
  return Status();
}

Status LeanKvSection::validate() const {
  STRATA_RETURN_IF_ERROR(check_keys(kLeanKvKeys, *this));
  if (alpha_low > alpha_high) {
    return invalid_argument_error("leankv.alpha_low (" + format_number(alpha_low) +
                                  ") must not exceed leankv.alpha_high (" +
                                  format_number(alpha_high) + ")");
  }
  if (low_key_bits > high_key_bits || low_value_bits > high_value_bits) {
    return invalid_argument_error(
        "leankv's low precision must not have more bits than its high one (low_key_bits <= "
        "high_key_bits, low_value_bits <= high_value_bits)");
  }
  return Status();
}

Status FreeKvSection::validate() const { return check_keys(kFreeKvKeys, *this); }

Status SchedulerSection::validate() const { return check_keys(kSchedulerKeys, *this); }

Status ServerSection::validate() const {
  STRATA_RETURN_IF_ERROR(check_keys(kServerKeys, *this));
  if (!api_keys.empty() && !api_keys_env.empty()) {
    return invalid_argument_error(
        "server.api_keys_env and server.api_keys are both set; set one of them");
  }
  if (grpc_port != 0 && grpc_port == http_port) {
    return invalid_argument_error("server.http_port must differ from server.grpc_port, both are " +
                                  std::to_string(grpc_port));
  }
  return Status();
}

StatusOr<std::vector<std::string>> resolve_api_keys(const ServerSection& server,
                                                    const EnvLookup& lookup) {
  STRATA_RETURN_IF_ERROR(server.validate());
  if (server.api_keys_env.empty()) return server.api_keys;
  const std::optional<std::string> value = lookup(server.api_keys_env);
  if (!value) {
    return failed_precondition_error("server.api_keys_env names the environment variable " +
                                     server.api_keys_env + ", which is not set");
  }
  std::vector<std::string> keys;
  std::string_view rest = *value;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view key = trim(rest.substr(0, comma));
    if (!key.empty()) keys.emplace_back(key);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  if (keys.empty()) {
    return failed_precondition_error("server.api_keys_env names the environment variable " +
                                     server.api_keys_env + ", which holds no key");
  }
  return keys;
}

Status SamplingSection::validate() const {
  const Status status = SamplingDefaults::validate();
  if (status.ok()) return status;
  return invalid_argument_error("sampling." + status.message());
}

Status DeploymentConfig::validate() const {
  STRATA_RETURN_IF_ERROR(model.validate());
  STRATA_RETURN_IF_ERROR(devices.validate());
  STRATA_RETURN_IF_ERROR(executor.validate());
  STRATA_RETURN_IF_ERROR(kv_cache.validate());
  STRATA_RETURN_IF_ERROR(kv_store.validate());
  STRATA_RETURN_IF_ERROR(leankv.validate());
  STRATA_RETURN_IF_ERROR(freekv.validate());
  STRATA_RETURN_IF_ERROR(scheduler.validate());
  STRATA_RETURN_IF_ERROR(server.validate());
  STRATA_RETURN_IF_ERROR(sampling.validate());
  STRATA_RETURN_IF_ERROR(logging.validate());
  if (kv_cache.gpu_memory_fraction && devices.device.kind == DeviceKind::kCpu) {
    return invalid_argument_error(
        "kv_cache.gpu_memory_fraction needs a cuda or auto device, but devices.device is cpu; "
        "size a CPU pool with kv_cache.cache_bytes");
  }
  if (kv_cache.page_format && kv_store.enabled()) {
    return invalid_argument_error(
        "kv_cache.page_format is " + kv::format_name(*kv_cache.page_format) +
        " but the KV store saves the compute dtype's exact KV and quantized pages do not save to "
        "it yet; unset kv_cache.page_format or set kv_store.dram_bytes to 0");
  }
  if (kv_store.enabled() && devices.tensor_parallel_size > 1 &&
      (kv_store.adaptcache.enabled || kv_store.adaptcache.fixed_codec != "none" ||
       kv_store.layer_pairing != LayerPairing::kNone || kv_store.stored_suffix)) {
    return invalid_argument_error(
        "the KV store's lossy codecs and stored suffix (kv_store.adaptcache, fixed_codec, "
        "layer_pairing, stored_suffix) are not served with tensor parallelism yet; set "
        "devices.tensor_parallel_size to 1 or turn them off");
  }
  if (leankv.enabled) {
    if (devices.device.kind == DeviceKind::kCuda) {
      return invalid_argument_error(
          "leankv.enabled needs devices.device cpu (or auto on a machine without a GPU) for now: "
          "its decode policy runs on the host (docs/leankv.md)");
    }
    if (kv_cache.page_format) {
      return invalid_argument_error(
          "leankv.enabled keeps its own page formats; unset kv_cache.page_format");
    }
    if (kv_cache.enable_prefix_caching) {
      return invalid_argument_error(
          "leankv.enabled compresses prompts computed from their first token; set "
          "kv_cache.enable_prefix_caching to false");
    }
    if (kv_store.enabled()) {
      return invalid_argument_error(
          "leankv.enabled does not save to the KV store yet; set kv_store.dram_bytes to 0");
    }
  }
  if (freekv.enabled) {
    if (leankv.enabled) {
      return invalid_argument_error("freekv.enabled and leankv.enabled exclude each other");
    }
    if (devices.tensor_parallel_size > 1) {
      return invalid_argument_error(
          "freekv.enabled serves one rank for now; set devices.tensor_parallel_size to 1");
    }
    if (kv_cache.page_format) {
      return invalid_argument_error("freekv.enabled reads the compute dtype's pages; unset "
                                    "kv_cache.page_format");
    }
    if (kv_cache.enable_prefix_caching) {
      return invalid_argument_error(
          "freekv.enabled takes sequences off the KV pool; set kv_cache.enable_prefix_caching to "
          "false");
    }
    if (kv_store.enabled() && (kv_store.restore_mode != store::RestoreMode::kLoad ||
                               kv_store.layer_pairing != store::LayerPairing::kNone ||
                               store::heavy_hitter_codec(kv_store.adaptcache.fixed_codec))) {
      return invalid_argument_error(
          "freekv.enabled restores stored KV by loading it: set kv_store.restore_mode to load, "
          "kv_store.layer_pairing to none and no h2o fixed_codec (docs/freekv.md, decision 17)");
    }
  }
  return Status();
}

const std::vector<std::string_view>& config_keys() {
  static const std::vector<std::string_view> kKeys = [] {
    std::vector<std::string_view> keys;
    append_keys(kModelKeys, keys);
    append_keys(kDevicesKeys, keys);
    append_keys(kExecutorKeys, keys);
    append_keys(kKvCacheKeys, keys);
    append_keys(kKvStoreKeys, keys);
    append_keys(kLeanKvKeys, keys);
    append_keys(kFreeKvKeys, keys);
    append_keys(kSchedulerKeys, keys);
    append_keys(kServerKeys, keys);
    append_keys(kSamplingKeys, keys);
    append_keys(kLoggingKeys, keys);
    return keys;
  }();
  return kKeys;
}

Status validate_key(const DeploymentConfig& config, std::string_view dotted_key) {
  bool found = false;
  Status status = check_one_key(kModelKeys, config.model, dotted_key, found);
  if (!found) status = check_one_key(kDevicesKeys, config.devices, dotted_key, found);
  if (!found) status = check_one_key(kExecutorKeys, config.executor, dotted_key, found);
  if (!found) status = check_one_key(kKvCacheKeys, config.kv_cache, dotted_key, found);
  if (!found) status = check_one_key(kKvStoreKeys, config.kv_store, dotted_key, found);
  if (!found) status = check_one_key(kLeanKvKeys, config.leankv, dotted_key, found);
  if (!found) status = check_one_key(kFreeKvKeys, config.freekv, dotted_key, found);
  if (!found) status = check_one_key(kSchedulerKeys, config.scheduler, dotted_key, found);
  if (!found) status = check_one_key(kServerKeys, config.server, dotted_key, found);
  if (!found) status = check_one_key(kSamplingKeys, config.sampling, dotted_key, found);
  if (!found) status = check_one_key(kLoggingKeys, config.logging, dotted_key, found);
  if (!found) {
    std::string message(dotted_key);
    message += " is not a config key";
    return not_found_error(std::move(message));
  }
  return status;
}

}  // namespace strata::config
