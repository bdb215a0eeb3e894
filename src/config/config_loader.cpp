#include "strata/config/config_loader.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <vector>

#include "strata/common/utf8.h"
#include "yaml_text.h"

namespace strata::config {
namespace {

constexpr std::string_view kOptionalKeys[] = {"kv_cache.gpu_memory_fraction",
                                              "kv_cache.cache_bytes",
                                              "kv_cache.page_format",
                                              "sampling.temperature",
                                              "sampling.top_k",
                                              "sampling.top_p",
                                              "sampling.min_p",
                                              "sampling.repetition_penalty",
                                              "sampling.presence_penalty",
                                              "sampling.frequency_penalty"};
constexpr std::string_view kListKeys[] = {"server.api_keys"};

bool contains(std::span<const std::string_view> list, std::string_view key) {
  for (std::string_view k : list) {
    if (k == key) return true;
  }
  return false;
}

std::string_view section_of(std::string_view dotted_key) {
  return dotted_key.substr(0, dotted_key.find('.'));
}

// The sections, in config_keys() order.
std::vector<std::string_view> section_names() {
  std::vector<std::string_view> names;
  for (std::string_view key : config_keys()) {
    if (names.empty() || names.back() != section_of(key)) names.push_back(section_of(key));
  }
  return names;
}

// The keys of `section` without the section prefix.
std::vector<std::string_view> keys_of(std::string_view section) {
  std::vector<std::string_view> keys;
  for (std::string_view key : config_keys()) {
    if (section_of(key) == section) keys.push_back(key.substr(section.size() + 1));
  }
  return keys;
}

std::string join(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// Where messages come from: "<source>:<line>:<column>: " when the node has a position.
struct Context {
  bool is_override = false;  // messages carry neither source nor position
  std::string source;
  // Position of every key read so far, by dotted key, to place validation errors.
  std::map<std::string, YAML::Mark, std::less<>> marks;

  Status error(const YAML::Mark& mark, const std::string& message) const {
    if (is_override) return invalid_argument_error(message);
    std::string text = source;
    if (!mark.is_null()) {
      text += ':';
      text += std::to_string(mark.line + 1);
      text += ':';
      text += std::to_string(mark.column + 1);
    }
    text += ": ";
    text += message;
    return invalid_argument_error(std::move(text));
  }
  Status error(const YAML::Node& node, const std::string& message) const {
    return error(node.Mark(), message);
  }
};

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

Status type_error(const Context& ctx, const YAML::Node& node, std::string_view key,
                  std::string_view expected) {
  return ctx.error(
      node, std::string(key) + ": expected " + std::string(expected) + ", got " + describe(node));
}

// ---- scalar readers: `node` is the value of `key` (dotted, for messages) ---------------------

Status read(const Context& ctx, const YAML::Node& node, std::string_view key, std::string& out) {
  if (!node.IsScalar()) return type_error(ctx, node, key, "a string");
  out = node.Scalar();
  return Status();
}

Status read(const Context& ctx, const YAML::Node& node, std::string_view key, bool& out) {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") {
      out = true;
      return Status();
    }
    if (s == "false" || s == "False" || s == "FALSE") {
      out = false;
      return Status();
    }
  }
  return type_error(ctx, node, key, "a boolean (true or false)");
}

template <typename Int>
Status read_integer(const Context& ctx, const YAML::Node& node, std::string_view key, Int& out) {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) {
      if (value < std::numeric_limits<Int>::min() || value > std::numeric_limits<Int>::max()) {
        return type_error(ctx, node, key,
                          "an integer in [" + std::to_string(std::numeric_limits<Int>::min()) +
                              ", " + std::to_string(std::numeric_limits<Int>::max()) + "]");
      }
      out = static_cast<Int>(value);
      return Status();
    }
    if (ec == std::errc::result_out_of_range) {
      return type_error(ctx, node, key, "a 64-bit integer");
    }
  }
  return type_error(ctx, node, key, "an integer");
}

Status read(const Context& ctx, const YAML::Node& node, std::string_view key, int32_t& out) {
  return read_integer(ctx, node, key, out);
}
Status read(const Context& ctx, const YAML::Node& node, std::string_view key, int64_t& out) {
  return read_integer(ctx, node, key, out);
}

Status read(const Context& ctx, const YAML::Node& node, std::string_view key, double& out) {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return Status();
  }
  return type_error(ctx, node, key, "a number");
}

Status read(const Context& ctx, const YAML::Node& node, std::string_view key,
            std::vector<std::string>& out) {
  if (!node.IsSequence()) return type_error(ctx, node, key, "a list of strings");
  std::vector<std::string> values;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node item = node[i];
    std::string& value = values.emplace_back();
    STRATA_RETURN_IF_ERROR(
        read(ctx, item, std::string(key) + "[" + std::to_string(i) + "]", value));
  }
  out = std::move(values);
  return Status();
}

// Byte sizes are int64 fields with their own spelling, so they have their own reader.
Status read_bytes(const Context& ctx, const YAML::Node& node, std::string_view key, int64_t& out) {
  if (node.IsScalar()) {
    if (std::optional<int64_t> bytes = parse_byte_size(node.Scalar())) {
      out = *bytes;
      return Status();
    }
  }
  return type_error(ctx, node, key,
                    "a byte size (an integer, optionally followed by KiB, MiB, GiB, TiB, KB, MB, "
                    "GB or TB)");
}

template <typename Enum>
Status read_enum(const Context& ctx, const YAML::Node& node, std::string_view key,
                 std::initializer_list<Enum> values, Enum& out) {
  if (node.IsScalar()) {
    for (Enum v : values) {
      if (config_name(v) == node.Scalar()) {
        out = v;
        return Status();
      }
    }
  }
  std::string names;
  for (Enum v : values) {
    if (!names.empty()) names += ", ";
    names += config_name(v).empty() ? std::string("\"\"") : std::string(config_name(v));
  }
  return type_error(ctx, node, key, "one of " + names);
}

Status read_device(const Context& ctx, const YAML::Node& node, DevicesSection& out) {
  constexpr std::string_view kKey = "devices.device";
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    for (DeviceKind kind : {DeviceKind::kAuto, DeviceKind::kCpu, DeviceKind::kCuda}) {
      if (s == config_name(kind)) {
        out.device = {kind, 0};
        return Status();
      }
    }
    constexpr std::string_view kCudaPrefix = "cuda:";
    if (s.starts_with(kCudaPrefix) && s.size() > kCudaPrefix.size() &&
        s[kCudaPrefix.size()] >= '0' && s[kCudaPrefix.size()] <= '9') {
      int32_t index = 0;
      const char* begin = s.data() + kCudaPrefix.size();
      const auto [end, ec] = std::from_chars(begin, s.data() + s.size(), index);
      if (ec == std::errc() && end == s.data() + s.size()) {
        out.device = {DeviceKind::kCuda, index};
        return Status();
      }
    }
  }
  return type_error(ctx, node, kKey, "one of auto, cpu, cuda, cuda:N");
}

// Optional keys: null clears them.
template <typename T>
Status read_optional(const Context& ctx, const YAML::Node& node, std::string_view key,
                     std::optional<T>& out) {
  if (node.IsNull()) {
    out.reset();
    return Status();
  }
  T value{};
  STRATA_RETURN_IF_ERROR(read(ctx, node, key, value));
  out = value;
  return Status();
}

// ---- sections -------------------------------------------------------------------------------

// The entries of one section's map, checked against the section's keys; by key without prefix.
class SectionMap {
 public:
  // `node` must be a map (or null: empty) whose keys are known and not repeated.
  static StatusOr<SectionMap> open(Context& ctx, const YAML::Node& node, std::string_view section) {
    SectionMap map;
    map.section_ = section;
    if (node.IsNull()) return map;
    if (!node.IsMap()) return type_error(ctx, node, section, "a map");
    const std::vector<std::string_view> allowed = keys_of(section);
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: `it->` yields a temporary
      const std::string name = key.IsScalar() ? key.Scalar() : describe(key);
      const std::string dotted = std::string(section) + "." + name;
      if (!key.IsScalar() || !contains(allowed, name)) {
        return ctx.error(key, "unknown key '" + dotted + "'; allowed keys in '" +
                                  std::string(section) + "': " + join(allowed));
      }
      if (map.entries_.count(name) != 0) {
        return ctx.error(key, "'" + dotted + "' is set twice");
      }
      ctx.marks[dotted] = key.Mark();
      map.entries_.emplace(name, it->second);
    }
    return map;
  }

  // Calls reader(value, dotted key) if `key` is present; absent keys keep their value.
  template <typename Reader>
  Status get(std::string_view key, Reader reader) const {
    auto it = entries_.find(key);
    if (it == entries_.end()) return Status();
    return reader(it->second, std::string(section_) + "." + std::string(key));
  }

 private:
  std::string_view section_;
  std::map<std::string, YAML::Node, std::less<>> entries_;
};

// A SectionMap reader that read()s the value into `field`.
template <typename T>
auto into(const Context& ctx, T& field) {
  return [&ctx, &field](const YAML::Node& node, const std::string& key) {
    return read(ctx, node, key, field);
  };
}

// Each read_<section> sets the keys present in `node` and leaves the others as they are
// (apply_override relies on that).
Status read_model(Context& ctx, const YAML::Node& node, ModelSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "model"));
  STRATA_RETURN_IF_ERROR(m.get("path", into(ctx, out.path)));
  STRATA_RETURN_IF_ERROR(m.get("dtype", [&](const YAML::Node& n, const std::string& k) {
    return read_enum<std::optional<DType>>(
        ctx, n, k, {std::nullopt, DType::kFloat32, DType::kBFloat16, DType::kFloat16}, out.dtype);
  }));
  STRATA_RETURN_IF_ERROR(m.get("weights", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k,
                     {executor::WeightStorage::kQuantized, executor::WeightStorage::kDequantize},
                     out.weights);
  }));
  STRATA_RETURN_IF_ERROR(m.get("chat_template", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k,
                     {ChatTemplateFallback::kNone, ChatTemplateFallback::kChatML,
                      ChatTemplateFallback::kLlama3, ChatTemplateFallback::kMistral},
                     out.chat_template);
  }));
  STRATA_RETURN_IF_ERROR(m.get("chat_template_file", into(ctx, out.chat_template_file)));
  return m.get("served_name", into(ctx, out.served_name));
}

Status read_devices(Context& ctx, const YAML::Node& node, DevicesSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "devices"));
  STRATA_RETURN_IF_ERROR(m.get(
      "device", [&](const YAML::Node& n, const std::string&) { return read_device(ctx, n, out); }));
  STRATA_RETURN_IF_ERROR(m.get("tensor_parallel_size", into(ctx, out.tensor_parallel_size)));
  STRATA_RETURN_IF_ERROR(m.get("nodes", into(ctx, out.nodes)));
  STRATA_RETURN_IF_ERROR(m.get("node_rank", into(ctx, out.node_rank)));
  STRATA_RETURN_IF_ERROR(m.get("master_address", into(ctx, out.master_address)));
  STRATA_RETURN_IF_ERROR(m.get("master_port", into(ctx, out.master_port)));
  STRATA_RETURN_IF_ERROR(
      m.get("collective_timeout_seconds", into(ctx, out.collective_timeout_seconds)));
  return m.get("cpu_threads", into(ctx, out.cpu_threads));
}

Status read_executor(Context& ctx, const YAML::Node& node, ExecutorSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "executor"));
  return m.get("kernels", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k, {kernels::KernelBackend::kStrata, kernels::KernelBackend::kTorch},
                     out.kernels);
  });
}

Status read_kv_cache(Context& ctx, const YAML::Node& node, KvCacheSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "kv_cache"));
  STRATA_RETURN_IF_ERROR(m.get("block_size_tokens", into(ctx, out.block_size_tokens)));
  STRATA_RETURN_IF_ERROR(
      m.get("gpu_memory_fraction", [&](const YAML::Node& n, const std::string& k) {
        return read_optional(ctx, n, k, out.gpu_memory_fraction);
      }));
  STRATA_RETURN_IF_ERROR(m.get("cache_bytes", [&](const YAML::Node& n, const std::string& k) {
    if (n.IsNull()) {
      out.cache_bytes.reset();
      return Status();
    }
    int64_t bytes = 0;
    STRATA_RETURN_IF_ERROR(read_bytes(ctx, n, k, bytes));
    out.cache_bytes = bytes;
    return Status();
  }));
  STRATA_RETURN_IF_ERROR(m.get("host_cache_bytes", [&](const YAML::Node& n, const std::string& k) {
    return read_bytes(ctx, n, k, out.host_cache_bytes);
  }));
  STRATA_RETURN_IF_ERROR(m.get("enable_prefix_caching", into(ctx, out.enable_prefix_caching)));
  STRATA_RETURN_IF_ERROR(m.get("page_format", [&](const YAML::Node& n, const std::string& k) {
    if (n.IsNull() || (n.IsScalar() && n.Scalar() == "auto")) {
      out.page_format.reset();
      return Status();
    }
    if (n.IsScalar()) {
      if (StatusOr<kv::KvFormat> format = kv::parse_format(n.Scalar()); format.ok()) {
        out.page_format = *format;
        return Status();
      }
    }
    return type_error(
        ctx, n, k, "auto or a page format (bfloat16, int8/token64, k:int8/token64,v:int4/token32)");
  }));
  STRATA_RETURN_IF_ERROR(m.get("page_blocks", into(ctx, out.page_blocks)));
  return m.get("max_context_tokens", into(ctx, out.max_context_tokens));
}

Status read_kv_store(Context& ctx, const YAML::Node& node, KvStoreSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "kv_store"));
  const auto bytes_into = [&ctx](int64_t& field) {
    return [&ctx, &field](const YAML::Node& n, const std::string& k) {
      return read_bytes(ctx, n, k, field);
    };
  };
  STRATA_RETURN_IF_ERROR(m.get("dram_bytes", bytes_into(out.dram_bytes)));
  STRATA_RETURN_IF_ERROR(m.get("ssd_dir", into(ctx, out.ssd_dir)));
  STRATA_RETURN_IF_ERROR(m.get("ssd_bytes", bytes_into(out.ssd_bytes)));
  STRATA_RETURN_IF_ERROR(m.get("ssd_file_bytes", bytes_into(out.ssd_file_bytes)));
  STRATA_RETURN_IF_ERROR(m.get("direct_io", into(ctx, out.direct_io)));
  STRATA_RETURN_IF_ERROR(m.get("ssd_bandwidth_limit", bytes_into(out.ssd_bandwidth_limit)));
  STRATA_RETURN_IF_ERROR(m.get("ssd_codec", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k, {CodecKind::kIdentity, CodecKind::kZstd}, out.ssd_codec);
  }));
  STRATA_RETURN_IF_ERROR(m.get("eviction_policy", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k,
                     {EvictionPolicy::kSchedulerAware, EvictionPolicy::kLru, EvictionPolicy::kFifo},
                     out.eviction_policy);
  }));
  STRATA_RETURN_IF_ERROR(m.get("io_threads", into(ctx, out.io_threads)));
  STRATA_RETURN_IF_ERROR(m.get("ttl_seconds", into(ctx, out.ttl_seconds)));
  STRATA_RETURN_IF_ERROR(m.get("dram_reserve_fraction", into(ctx, out.dram_reserve_fraction)));
  STRATA_RETURN_IF_ERROR(m.get("adaptcache", into(ctx, out.adaptcache.enabled)));
  STRATA_RETURN_IF_ERROR(m.get("fixed_codec", into(ctx, out.adaptcache.fixed_codec)));
  STRATA_RETURN_IF_ERROR(m.get("adaptcache_alpha", into(ctx, out.adaptcache.alpha)));
  STRATA_RETURN_IF_ERROR(
      m.get("adaptcache_half_life_seconds", into(ctx, out.adaptcache.half_life_seconds)));
  STRATA_RETURN_IF_ERROR(m.get("adaptcache_profile", into(ctx, out.adaptcache.profile)));
  STRATA_RETURN_IF_ERROR(m.get("remote_address", into(ctx, out.remote.address)));
  STRATA_RETURN_IF_ERROR(m.get("remote_username", into(ctx, out.remote.username)));
  STRATA_RETURN_IF_ERROR(m.get("remote_password_env", into(ctx, out.remote.password_env)));
  STRATA_RETURN_IF_ERROR(m.get("remote_database", into(ctx, out.remote.database)));
  STRATA_RETURN_IF_ERROR(m.get("remote_bytes", bytes_into(out.remote.bytes)));
  STRATA_RETURN_IF_ERROR(m.get("remote_max_item_bytes", bytes_into(out.remote.max_item_bytes)));
  STRATA_RETURN_IF_ERROR(m.get("remote_timeout_ms", into(ctx, out.remote.timeout_ms)));
  STRATA_RETURN_IF_ERROR(m.get("remote_retry_ms", into(ctx, out.remote.retry_ms)));
  STRATA_RETURN_IF_ERROR(m.get("remote_ttl_seconds", into(ctx, out.remote.ttl_seconds)));
  STRATA_RETURN_IF_ERROR(m.get("remote_codec", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k, {CodecKind::kIdentity, CodecKind::kZstd}, out.remote.codec);
  }));
  STRATA_RETURN_IF_ERROR(m.get("restore_mode", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k, {RestoreMode::kLoad, RestoreMode::kKrul, RestoreMode::kPartial},
                     out.restore_mode);
  }));
  STRATA_RETURN_IF_ERROR(m.get("recompute_ratio", into(ctx, out.recompute_ratio)));
  STRATA_RETURN_IF_ERROR(m.get("stored_suffix", into(ctx, out.stored_suffix)));
  STRATA_RETURN_IF_ERROR(m.get("layer_pairing", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k,
                     {LayerPairing::kNone, LayerPairing::kKrul, LayerPairing::kMiniCache},
                     out.layer_pairing);
  }));
  STRATA_RETURN_IF_ERROR(m.get("layer_share", into(ctx, out.layer_share)));
  STRATA_RETURN_IF_ERROR(m.get("krul_gamma", into(ctx, out.krul_gamma)));
  STRATA_RETURN_IF_ERROR(m.get("krul_row_stride", into(ctx, out.krul_row_stride)));
  STRATA_RETURN_IF_ERROR(m.get("merge_retain", into(ctx, out.merge_retain)));
  return m.get("read_buffer_layers", into(ctx, out.read_buffer_layers));
}

Status read_leankv(Context& ctx, const YAML::Node& node, LeanKvSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "leankv"));
  STRATA_RETURN_IF_ERROR(m.get("enabled", into(ctx, out.enabled)));
  STRATA_RETURN_IF_ERROR(m.get("alpha_high", into(ctx, out.alpha_high)));
  STRATA_RETURN_IF_ERROR(m.get("alpha_low", into(ctx, out.alpha_low)));
  STRATA_RETURN_IF_ERROR(m.get("window", into(ctx, out.window)));
  STRATA_RETURN_IF_ERROR(m.get("high_key_bits", into(ctx, out.high_key_bits)));
  STRATA_RETURN_IF_ERROR(m.get("high_value_bits", into(ctx, out.high_value_bits)));
  STRATA_RETURN_IF_ERROR(m.get("low_key_bits", into(ctx, out.low_key_bits)));
  STRATA_RETURN_IF_ERROR(m.get("low_value_bits", into(ctx, out.low_value_bits)));
  STRATA_RETURN_IF_ERROR(m.get("high_tokens_per_page", into(ctx, out.high_tokens_per_page)));
  STRATA_RETURN_IF_ERROR(m.get("pool_bytes", [&](const YAML::Node& n, const std::string& k) {
    return read_bytes(ctx, n, k, out.pool_bytes);
  }));
  return m.get("max_sequences", into(ctx, out.max_sequences));
}

Status read_freekv(Context& ctx, const YAML::Node& node, FreeKvSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "freekv"));
  STRATA_RETURN_IF_ERROR(m.get("enabled", into(ctx, out.enabled)));
  STRATA_RETURN_IF_ERROR(m.get("method", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k, {FreeKvMethod::kRetrieval, FreeKvMethod::kH2o}, out.method);
  }));
  STRATA_RETURN_IF_ERROR(m.get("page_tokens", into(ctx, out.page_tokens)));
  STRATA_RETURN_IF_ERROR(m.get("budget_tokens", into(ctx, out.budget_tokens)));
  STRATA_RETURN_IF_ERROR(m.get("sink_tokens", into(ctx, out.sink_tokens)));
  STRATA_RETURN_IF_ERROR(m.get("window_tokens", into(ctx, out.window_tokens)));
  STRATA_RETURN_IF_ERROR(m.get("tau", into(ctx, out.tau)));
  STRATA_RETURN_IF_ERROR(m.get("min_context_tokens", into(ctx, out.min_context_tokens)));
  return m.get("host_bytes", [&](const YAML::Node& n, const std::string& k) {
    return read_bytes(ctx, n, k, out.host_bytes);
  });
}

Status read_scheduler(Context& ctx, const YAML::Node& node, SchedulerSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "scheduler"));
  STRATA_RETURN_IF_ERROR(m.get("max_num_seqs", into(ctx, out.max_num_seqs)));
  STRATA_RETURN_IF_ERROR(m.get("max_num_batched_tokens", into(ctx, out.max_num_batched_tokens)));
  STRATA_RETURN_IF_ERROR(m.get("preemption_mode", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k, {PreemptionMode::kRecompute, PreemptionMode::kSwap},
                     out.preemption_mode);
  }));
  STRATA_RETURN_IF_ERROR(m.get("max_queued_requests", into(ctx, out.max_queued_requests)));
  return m.get("overflow_truncation_fraction", into(ctx, out.overflow_truncation_fraction));
}

Status read_server(Context& ctx, const YAML::Node& node, ServerSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "server"));
  STRATA_RETURN_IF_ERROR(m.get("host", into(ctx, out.host)));
  STRATA_RETURN_IF_ERROR(m.get("grpc_port", into(ctx, out.grpc_port)));
  STRATA_RETURN_IF_ERROR(m.get("http_port", into(ctx, out.http_port)));
  STRATA_RETURN_IF_ERROR(m.get("api_keys", into(ctx, out.api_keys)));
  STRATA_RETURN_IF_ERROR(m.get("api_keys_env", into(ctx, out.api_keys_env)));
  STRATA_RETURN_IF_ERROR(m.get("shutdown_grace_seconds", into(ctx, out.shutdown_grace_seconds)));
  STRATA_RETURN_IF_ERROR(m.get("request_timeout_seconds", into(ctx, out.request_timeout_seconds)));
  return m.get("max_connections", into(ctx, out.max_connections));
}

Status read_logging(Context& ctx, const YAML::Node& node, LoggingSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "logging"));
  STRATA_RETURN_IF_ERROR(m.get("level", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(
        ctx, n, k,
        {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError},
        out.level);
  }));
  return m.get("format", [&](const YAML::Node& n, const std::string& k) {
    return read_enum(ctx, n, k, {LogFormat::kText, LogFormat::kJson}, out.format);
  });
}

Status read_sampling(Context& ctx, const YAML::Node& node, SamplingSection& out) {
  STRATA_ASSIGN_OR_RETURN(const SectionMap m, SectionMap::open(ctx, node, "sampling"));
  auto optional = [&](auto& field) {
    return [&ctx, &field](const YAML::Node& n, const std::string& k) {
      return read_optional(ctx, n, k, field);
    };
  };
  STRATA_RETURN_IF_ERROR(m.get("temperature", optional(out.temperature)));
  STRATA_RETURN_IF_ERROR(m.get("top_k", optional(out.top_k)));
  STRATA_RETURN_IF_ERROR(m.get("top_p", optional(out.top_p)));
  STRATA_RETURN_IF_ERROR(m.get("min_p", optional(out.min_p)));
  STRATA_RETURN_IF_ERROR(m.get("repetition_penalty", optional(out.repetition_penalty)));
  STRATA_RETURN_IF_ERROR(m.get("presence_penalty", optional(out.presence_penalty)));
  STRATA_RETURN_IF_ERROR(m.get("frequency_penalty", optional(out.frequency_penalty)));
  return m.get("use_generation_config", into(ctx, out.use_generation_config));
}

// Reads the section named `section` of `node` into `config`; false if there is no such section.
bool read_section(Context& ctx, std::string_view section, const YAML::Node& node,
                  DeploymentConfig& config, Status& status) {
  if (section == "model") {
    status = read_model(ctx, node, config.model);
  } else if (section == "devices") {
    status = read_devices(ctx, node, config.devices);
  } else if (section == "executor") {
    status = read_executor(ctx, node, config.executor);
  } else if (section == "kv_cache") {
    status = read_kv_cache(ctx, node, config.kv_cache);
  } else if (section == "kv_store") {
    status = read_kv_store(ctx, node, config.kv_store);
  } else if (section == "leankv") {
    status = read_leankv(ctx, node, config.leankv);
  } else if (section == "freekv") {
    status = read_freekv(ctx, node, config.freekv);
  } else if (section == "scheduler") {
    status = read_scheduler(ctx, node, config.scheduler);
  } else if (section == "server") {
    status = read_server(ctx, node, config.server);
  } else if (section == "sampling") {
    status = read_sampling(ctx, node, config.sampling);
  } else if (section == "logging") {
    status = read_logging(ctx, node, config.logging);
  } else {
    return false;
  }
  return true;
}

Status unknown_section(const Context& ctx, const YAML::Mark& mark, std::string_view key) {
  return ctx.error(mark, "unknown key '" + std::string(key) +
                             "'; allowed top-level keys: " + join(section_names()));
}

Status read_document(Context& ctx, const YAML::Node& root, DeploymentConfig& config) {
  if (root.IsNull()) return Status();
  if (!root.IsMap()) {
    return ctx.error(
        root, "expected a map of sections (" + join(section_names()) + "), got " + describe(root));
  }
  std::set<std::string, std::less<>> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const YAML::Node key = it->first;  // a copy: `it->` yields a temporary
    if (!key.IsScalar()) return unknown_section(ctx, key.Mark(), describe(key));
    const std::string& name = key.Scalar();
    if (!seen.insert(name).second) return ctx.error(key, "'" + name + "' is set twice");
    Status status;
    if (!read_section(ctx, name, it->second, config, status)) {
      return unknown_section(ctx, key.Mark(), name);
    }
    STRATA_RETURN_IF_ERROR(status);
  }
  return Status();
}

}  // namespace

StatusOr<DeploymentConfig> parse_config(std::string_view yaml_text, std::string_view source_name) {
  Context ctx;
  ctx.source = std::string(source_name);
  DeploymentConfig config;
  try {
    if (const std::optional<YamlTextProblem> problem = check_yaml_text(yaml_text)) {
      return ctx.error(problem->mark, problem->message);
    }
    const YAML::Node doc = YAML::Load(std::string(yaml_text));
    if (doc.IsDefined()) STRATA_RETURN_IF_ERROR(read_document(ctx, doc, config));
  } catch (const YAML::Exception& e) {
    return ctx.error(e.mark, "invalid YAML: " + e.msg);
  }
  if (Status status = config.validate(); !status.ok()) {
    // Messages start with the dotted key (deployment_config.h); place it if the file set it.
    const std::string& message = status.message();
    const std::string key = message.substr(0, message.find_first_of(" :["));
    auto it = ctx.marks.find(key);
    return ctx.error(it == ctx.marks.end() ? YAML::Mark::null_mark() : it->second, message);
  }
  return config;
}

StatusOr<DeploymentConfig> load_config_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return not_found_error("cannot open config file " + path);
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return not_found_error("cannot read config file " + path);
  return parse_config(text.str(), path);
}

Status apply_override(DeploymentConfig& config, std::string_view dotted_key,
                      std::string_view value) {
  Context ctx;
  ctx.is_override = true;
  if (!is_valid_utf8(dotted_key) || !is_valid_utf8(value)) {
    return invalid_argument_error("override is not valid UTF-8");
  }
  const std::string_view section = section_of(dotted_key);
  if (!contains(section_names(), section)) {
    return unknown_section(ctx, YAML::Mark::null_mark(), dotted_key);
  }
  const std::vector<std::string_view> allowed = keys_of(section);
  if (section.size() == dotted_key.size()) {
    return invalid_argument_error("'" + std::string(section) +
                                  "' is a section; override one of its keys: " + join(allowed));
  }
  const std::string key(dotted_key.substr(section.size() + 1));
  if (!contains(allowed, key)) {
    return invalid_argument_error("unknown key '" + std::string(dotted_key) +
                                  "'; allowed keys in '" + std::string(section) +
                                  "': " + join(allowed));
  }

  YAML::Node node;
  if (contains(kOptionalKeys, dotted_key) && (value == "null" || value == "~")) {
    node = YAML::Node(YAML::NodeType::Null);
  } else if (contains(kListKeys, dotted_key)) {
    try {
      node = YAML::Load(std::string(value));
    } catch (const YAML::Exception& e) {
      return invalid_argument_error(std::string(dotted_key) +
                                    ": expected a list like [a, b], got '" + std::string(value) +
                                    "' (" + e.msg + ")");
    }
  } else {
    node = YAML::Node(std::string(value));
  }
  YAML::Node section_node(YAML::NodeType::Map);
  section_node[key] = node;

  DeploymentConfig updated = config;
  Status status;
  read_section(ctx, section, section_node, updated, status);
  STRATA_RETURN_IF_ERROR(status);
  STRATA_RETURN_IF_ERROR(validate_key(updated, dotted_key));
  config = std::move(updated);
  return Status();
}

}  // namespace strata::config
