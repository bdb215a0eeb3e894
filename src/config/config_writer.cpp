// to_yaml: a DeploymentConfig written as the deployment file that parse_config reads back
// (config_loader.h), every key present, in default.yaml's order.
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <string>
#include <string_view>

#include "strata/config/config_loader.h"

namespace strata::config {
namespace {

std::string format_double(double value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, end);
}

void emit_string(YAML::Emitter& out, std::string_view key, const std::string& value) {
  out << YAML::Key << std::string(key) << YAML::Value << YAML::DoubleQuoted << value;
}

void emit_plain(YAML::Emitter& out, std::string_view key, const std::string& value) {
  out << YAML::Key << std::string(key) << YAML::Value << value;
}

void emit_name(YAML::Emitter& out, std::string_view key, std::string_view name) {
  if (name.empty()) {
    emit_string(out, key, "");
  } else {
    emit_plain(out, key, std::string(name));
  }
}

}  // namespace

std::string to_yaml(const DeploymentConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  emit_string(out, "path", config.model.path);
  emit_name(out, "dtype", config_name(config.model.dtype));
  emit_name(out, "weights", config_name(config.model.weights));
  emit_name(out, "chat_template", config_name(config.model.chat_template));
  emit_string(out, "chat_template_file", config.model.chat_template_file);
  emit_string(out, "served_name", config.model.served_name);
  out << YAML::EndMap;

  out << YAML::Key << "devices" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "device", device_config_name(config.devices));
  emit_plain(out, "tensor_parallel_size", std::to_string(config.devices.tensor_parallel_size));
  emit_plain(out, "nodes", std::to_string(config.devices.nodes));
  emit_plain(out, "node_rank", std::to_string(config.devices.node_rank));
  emit_string(out, "master_address", config.devices.master_address);
  emit_plain(out, "master_port", std::to_string(config.devices.master_port));
  emit_plain(out, "collective_timeout_seconds",
             std::to_string(config.devices.collective_timeout_seconds));
  emit_plain(out, "cpu_threads", std::to_string(config.devices.cpu_threads));
  out << YAML::EndMap;

  out << YAML::Key << "executor" << YAML::Value << YAML::BeginMap;
  emit_name(out, "kernels", config_name(config.executor.kernels));
  out << YAML::EndMap;

  const KvCacheSection& kv = config.kv_cache;
  out << YAML::Key << "kv_cache" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "block_size_tokens", std::to_string(kv.block_size_tokens));
  out << YAML::Key << "gpu_memory_fraction" << YAML::Value;
  if (kv.gpu_memory_fraction) {
    out << format_double(*kv.gpu_memory_fraction);
  } else {
    out << YAML::Null;
  }
  out << YAML::Key << "cache_bytes" << YAML::Value;
  if (kv.cache_bytes) {
    out << format_byte_size(*kv.cache_bytes);
  } else {
    out << YAML::Null;
  }
  emit_plain(out, "host_cache_bytes", format_byte_size(kv.host_cache_bytes));
  emit_plain(out, "enable_prefix_caching", kv.enable_prefix_caching ? "true" : "false");
  emit_plain(out, "page_format", kv.page_format ? kv::format_name(*kv.page_format) : "auto");
  emit_plain(out, "page_blocks", std::to_string(kv.page_blocks));
  emit_plain(out, "max_context_tokens", std::to_string(kv.max_context_tokens));
  out << YAML::EndMap;

  const KvStoreSection& store = config.kv_store;
  out << YAML::Key << "kv_store" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "dram_bytes", format_byte_size(store.dram_bytes));
  emit_string(out, "ssd_dir", store.ssd_dir);
  emit_plain(out, "ssd_bytes", format_byte_size(store.ssd_bytes));
  emit_plain(out, "ssd_file_bytes", format_byte_size(store.ssd_file_bytes));
  emit_plain(out, "direct_io", store.direct_io ? "true" : "false");
  emit_plain(out, "ssd_bandwidth_limit", format_byte_size(store.ssd_bandwidth_limit));
  emit_name(out, "ssd_codec", config_name(store.ssd_codec));
  emit_name(out, "eviction_policy", config_name(store.eviction_policy));
  emit_plain(out, "io_threads", std::to_string(store.io_threads));
  emit_plain(out, "ttl_seconds", std::to_string(store.ttl_seconds));
  emit_plain(out, "dram_reserve_fraction", format_double(store.dram_reserve_fraction));
  emit_plain(out, "read_buffer_layers", std::to_string(store.read_buffer_layers));
  emit_name(out, "restore_mode", config_name(store.restore_mode));
  emit_plain(out, "recompute_ratio", format_double(store.recompute_ratio));
  emit_plain(out, "stored_suffix", store.stored_suffix ? "true" : "false");
  emit_name(out, "layer_pairing", config_name(store.layer_pairing));
  emit_plain(out, "layer_share", format_double(store.layer_share));
  emit_plain(out, "krul_gamma", format_double(store.krul_gamma));
  emit_plain(out, "krul_row_stride", std::to_string(store.krul_row_stride));
  emit_plain(out, "merge_retain", format_double(store.merge_retain));
  emit_plain(out, "adaptcache", store.adaptcache.enabled ? "true" : "false");
  emit_string(out, "fixed_codec", store.adaptcache.fixed_codec);
  emit_plain(out, "adaptcache_alpha", format_double(store.adaptcache.alpha));
  emit_plain(out, "adaptcache_half_life_seconds", format_double(store.adaptcache.half_life_seconds));
  emit_string(out, "adaptcache_profile", store.adaptcache.profile);
  emit_string(out, "remote_address", store.remote.address);
  emit_string(out, "remote_username", store.remote.username);
  emit_string(out, "remote_password_env", store.remote.password_env);
  emit_plain(out, "remote_database", std::to_string(store.remote.database));
  emit_plain(out, "remote_bytes", format_byte_size(store.remote.bytes));
  emit_plain(out, "remote_max_item_bytes", format_byte_size(store.remote.max_item_bytes));
  emit_plain(out, "remote_timeout_ms", std::to_string(store.remote.timeout_ms));
  emit_plain(out, "remote_retry_ms", std::to_string(store.remote.retry_ms));
  emit_plain(out, "remote_ttl_seconds", std::to_string(store.remote.ttl_seconds));
  emit_name(out, "remote_codec", config_name(store.remote.codec));
  out << YAML::EndMap;

  const LeanKvSection& lean = config.leankv;
  out << YAML::Key << "leankv" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "enabled", lean.enabled ? "true" : "false");
  emit_plain(out, "alpha_high", format_double(lean.alpha_high));
  emit_plain(out, "alpha_low", format_double(lean.alpha_low));
  emit_plain(out, "window", std::to_string(lean.window));
  emit_plain(out, "high_key_bits", std::to_string(lean.high_key_bits));
  emit_plain(out, "high_value_bits", std::to_string(lean.high_value_bits));
  emit_plain(out, "low_key_bits", std::to_string(lean.low_key_bits));
  emit_plain(out, "low_value_bits", std::to_string(lean.low_value_bits));
  emit_plain(out, "high_tokens_per_page", std::to_string(lean.high_tokens_per_page));
  emit_plain(out, "pool_bytes", format_byte_size(lean.pool_bytes));
  emit_plain(out, "max_sequences", std::to_string(lean.max_sequences));
  out << YAML::EndMap;

  const FreeKvSection& free = config.freekv;
  out << YAML::Key << "freekv" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "enabled", free.enabled ? "true" : "false");
  emit_name(out, "method", config_name(free.method));
  emit_plain(out, "page_tokens", std::to_string(free.page_tokens));
  emit_plain(out, "budget_tokens", std::to_string(free.budget_tokens));
  emit_plain(out, "sink_tokens", std::to_string(free.sink_tokens));
  emit_plain(out, "window_tokens", std::to_string(free.window_tokens));
  emit_plain(out, "tau", format_double(free.tau));
  emit_plain(out, "min_context_tokens", std::to_string(free.min_context_tokens));
  emit_plain(out, "host_bytes", format_byte_size(free.host_bytes));
  out << YAML::EndMap;

  const SchedulerSection& sched = config.scheduler;
  out << YAML::Key << "scheduler" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "max_num_seqs", std::to_string(sched.max_num_seqs));
  emit_plain(out, "max_num_batched_tokens", std::to_string(sched.max_num_batched_tokens));
  emit_name(out, "preemption_mode", config_name(sched.preemption_mode));
  emit_plain(out, "max_queued_requests", std::to_string(sched.max_queued_requests));
  emit_plain(out, "overflow_truncation_fraction",
             format_double(sched.overflow_truncation_fraction));
  out << YAML::EndMap;

  const ServerSection& server = config.server;
  out << YAML::Key << "server" << YAML::Value << YAML::BeginMap;
  emit_string(out, "host", server.host);
  emit_plain(out, "grpc_port", std::to_string(server.grpc_port));
  emit_plain(out, "http_port", std::to_string(server.http_port));
  out << YAML::Key << "api_keys" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const std::string& key : server.api_keys) out << YAML::DoubleQuoted << key;
  out << YAML::EndSeq;
  emit_string(out, "api_keys_env", server.api_keys_env);
  emit_plain(out, "shutdown_grace_seconds", std::to_string(server.shutdown_grace_seconds));
  emit_plain(out, "request_timeout_seconds", std::to_string(server.request_timeout_seconds));
  emit_plain(out, "max_connections", std::to_string(server.max_connections));
  out << YAML::EndMap;

  const SamplingSection& sampling = config.sampling;
  out << YAML::Key << "sampling" << YAML::Value << YAML::BeginMap;
  auto emit_optional = [&out](const char* key, const auto& value) {
    out << YAML::Key << key << YAML::Value;
    if (value) {
      out << format_double(static_cast<double>(*value));
    } else {
      out << YAML::Null;
    }
  };
  emit_optional("temperature", sampling.temperature);
  emit_optional("top_k", sampling.top_k);
  emit_optional("top_p", sampling.top_p);
  emit_optional("min_p", sampling.min_p);
  emit_optional("repetition_penalty", sampling.repetition_penalty);
  emit_optional("presence_penalty", sampling.presence_penalty);
  emit_optional("frequency_penalty", sampling.frequency_penalty);
  emit_plain(out, "use_generation_config", sampling.use_generation_config ? "true" : "false");
  out << YAML::EndMap;

  out << YAML::Key << "logging" << YAML::Value << YAML::BeginMap;
  emit_name(out, "level", config_name(config.logging.level));
  emit_name(out, "format", config_name(config.logging.format));
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace strata::config
