// DeploymentConfig: the typed tree one deployment file (configs/*.yaml) describes, one struct per
// top-level section. Plain data with defaults; config_loader.h reads and writes the YAML form, and
// configs/default.yaml documents every key once.
//
// The sections are the configurations of the modules they configure (executor::DevicesConfig,
// KernelsConfig and KvCacheConfig, store::StoreConfig, engine::SchedulingConfig: plain headers),
// with validation added, so the engine takes them as they are; this module links strata_common
// and strata_kv (page format names).
//
// Validation: every validate() returns INVALID_ARGUMENT whose message starts with the full dotted
// key it is about ("scheduler.max_num_seqs must be >= 1, got 0"); the loader relies on that to add
// the key's line and column. Thread-compatible value types.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/dtype.h"
#include "strata/common/status.h"
#include "strata/engine/engine_config.h"
#include "strata/executor/executor_config.h"
#include "strata/kernels/kernel_selection.h"
#include "strata/sampling/sampling_params.h"
#include "strata/scheduler/scheduler.h"
#include "strata/store/codec.h"
#include "strata/store/placement_policy.h"
#include "strata/store/store_config.h"

namespace strata::config {

// ---- model ----------------------------------------------------------------------------------

// The chat template used when the model carries none (or one we cannot run).
enum class ChatTemplateFallback { kNone, kChatML, kLlama3, kMistral };

struct ModelSection {
  // A .gguf file or a HF model directory; relative paths are relative to the process's working
  // directory (not to the config file). Required.
  std::string path;
  // The compute dtype (float32, bfloat16 or float16); nullopt is "auto": bfloat16 on a CUDA
  // device, float32 on the CPU (the caller resolves it).
  std::optional<DType> dtype;
  // quantized: weights the file stores quantized stay so and are multiplied by libtorch's
  // weight-only kernels (CPU); dequantize: converted to the compute dtype at load.
  executor::WeightStorage weights = executor::WeightStorage::kQuantized;
  // The built-in template for a model that ships none.
  ChatTemplateFallback chat_template = ChatTemplateFallback::kNone;
  // A Jinja chat template file used instead of the model's own (vLLM's --chat-template); empty:
  // the model's. Relative to the working directory.
  std::string chat_template_file;
  // The model name the APIs report; empty: effective_served_name() derives it from `path`.
  std::string served_name;

  // served_name, or else the last component of `path` without its extension
  // (".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct.Q4_1",
  // "/models/llama-3-70b-instruct/" -> "llama-3-70b-instruct").
  std::string effective_served_name() const;

  // INVALID_ARGUMENT naming model.<key>.
  Status validate() const;
  bool operator==(const ModelSection&) const = default;
};

// ---- devices --------------------------------------------------------------------------------

using executor::Device;
using executor::DeviceKind;

// device ("auto" | "cpu" | "cuda" | "cuda:N"), tensor_parallel_size, cpu_threads: the executor's
// DevicesConfig.
struct DevicesSection : executor::DevicesConfig {
  // INVALID_ARGUMENT naming devices.<key>.
  Status validate() const;
  bool operator==(const DevicesSection&) const = default;
};

// "auto" | "cpu" | "cuda" | "cuda:N": the YAML spelling of a DevicesSection's device ("cuda" for
// the first GPU), which executor::parse_device() accepts too.
std::string device_config_name(const DevicesSection& devices);

// ---- executor -------------------------------------------------------------------------------

// kernels: strata | torch (executor::KernelsConfig).
struct ExecutorSection : executor::KernelsConfig {
  Status validate() const { return Status(); }  // every value of the enum is valid
  bool operator==(const ExecutorSection&) const = default;
};

// ---- kv_cache -------------------------------------------------------------------------------

// The device KV pool (executor::KvCacheConfig): block_size_tokens is a power of two in [1, 256];
// gpu_memory_fraction (in (0, 1], needs a CUDA or auto device) and cache_bytes (>= 1) are not
// both set; format is a page format name (kv::parse_format) that validates for the model's
// head_dim; page_blocks in [0, 64].
struct KvCacheSection : executor::KvCacheConfig {
  // INVALID_ARGUMENT naming kv_cache.<key>.
  Status validate() const;
  bool operator==(const KvCacheSection&) const = default;
};

// ---- kv_store -------------------------------------------------------------------------------

// Which stored conversation leaves a tier first when it is full (store/placement_policy.h).
using store::CodecKind;
using store::EvictionPolicy;
using store::LayerPairing;
using store::RestoreMode;

// The multi-tier KV store (store::StoreConfig): the KV of finished conversation turns kept in
// host DRAM and on a local SSD, so the next turn loads it instead of recomputing its history
// (docs/kv-store.md).
struct KvStoreSection : store::StoreConfig {
  // INVALID_ARGUMENT naming kv_store.<key>.
  Status validate() const;
  bool operator==(const KvStoreSection&) const = default;
};

// ---- leankv ---------------------------------------------------------------------------------

// LeanKV (executor::LeanKvConfig, docs/leankv.md): alpha_high >= alpha_low >= 0, window >= 1,
// bits 8, 4 or 2 with the low ones at most the high ones, high_tokens_per_page in [8, 256],
// pool_bytes >= 1MiB, max_sequences >= 1. Enabled, it needs a cpu (or auto) device, no
// kv_cache.page_format, no prefix caching and no KV store (DeploymentConfig::validate).
struct LeanKvSection : executor::LeanKvConfig {
  // INVALID_ARGUMENT naming leankv.<key>.
  Status validate() const;
  bool operator==(const LeanKvSection&) const = default;
};

// ---- freekv ---------------------------------------------------------------------------------

// FreeKV (executor::FreeKvConfig, docs/freekv.md): method retrieval or h2o, page_tokens in
// [1, 1024], sink_tokens and window_tokens whole pages, budget_tokens at least their sum (equal:
// StreamingLLM) and, for h2o, above window_tokens (>= 1), tau in [-1, 2] (above 1: every step
// corrects, synchronous retrieval), min_context_tokens >= budget_tokens, host_bytes >= 1MiB.
// Enabled, it needs one rank, no leankv, no kv_cache.page_format, no prefix caching and no KV store
// (DeploymentConfig::validate).
using executor::FreeKvMethod;
struct FreeKvSection : executor::FreeKvConfig {
  // INVALID_ARGUMENT naming freekv.<key>.
  Status validate() const;
  bool operator==(const FreeKvSection&) const = default;
};

// ---- scheduler ------------------------------------------------------------------------------

using scheduler::PreemptionMode;

// The scheduler's own options (max_num_seqs, max_num_batched_tokens, preemption_mode) and the
// engine's admission rules (max_queued_requests, overflow_truncation_fraction in [0, 0.9]):
// engine::SchedulingConfig.
struct SchedulerSection : engine::SchedulingConfig {
  // INVALID_ARGUMENT naming scheduler.<key>.
  Status validate() const;
  bool operator==(const SchedulerSection&) const = default;
};

// ---- server ---------------------------------------------------------------------------------

struct ServerSection {
  std::string host = "127.0.0.1";  // address both servers bind
  int32_t grpc_port = 50051;       // 0 disables the gRPC server
  int32_t http_port = 8000;        // 0 disables the HTTP server
  // Accepted bearer keys; empty (and no api_keys_env): no authentication. At most one of
  // api_keys and api_keys_env is set; resolve_api_keys() gives the effective list.
  std::vector<std::string> api_keys;
  // Name of an environment variable holding comma-separated keys, so secrets stay out of the file.
  std::string api_keys_env;
  int32_t shutdown_grace_seconds = 30;  // time in-flight requests get to finish on shutdown
  int32_t request_timeout_seconds = 0;  // per request; 0: none
  // HTTP connections open at once; more are answered 503 (keep below the process's `ulimit -n`).
  int32_t max_connections = 1024;

  // INVALID_ARGUMENT naming server.<key>.
  Status validate() const;
  bool operator==(const ServerSection&) const = default;
};

// Reads an environment variable: its value, or nullopt when it is not set. Library code never
// reads the environment itself; main() passes a function over getenv (or a fake in tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The effective API keys: server.api_keys, or else the comma-separated, whitespace-trimmed,
// non-empty entries of the variable server.api_keys_env names, looked up through `lookup`
// (called only when api_keys_env is set). FAILED_PRECONDITION naming server.api_keys_env and the
// variable when it is unset or holds no key (authentication was asked for; failing open would
// disable it).
StatusOr<std::vector<std::string>> resolve_api_keys(const ServerSection& server,
                                                    const EnvLookup& lookup);

// ---- sampling -------------------------------------------------------------------------------

// What a request's unset sampling fields take (OpenAI's built-in defaults where nothing is set):
// the model's own (a GGUF's general.sampling.*, an HF directory's generation_config.json) where
// it has one and use_generation_config is true, else these.
struct SamplingSection : sampling::SamplingDefaults {
  bool use_generation_config = true;

  // INVALID_ARGUMENT naming sampling.<key>.
  Status validate() const;
  bool operator==(const SamplingSection&) const = default;
};

// ---- logging --------------------------------------------------------------------------------

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };
enum class LogFormat { kText, kJson };

struct LoggingSection {
  LogLevel level = LogLevel::kInfo;
  LogFormat format = LogFormat::kText;

  Status validate() const { return Status(); }  // every value of the enums is valid
  bool operator==(const LoggingSection&) const = default;
};

// ---- the tree -------------------------------------------------------------------------------

struct DeploymentConfig {
  ModelSection model;
  DevicesSection devices;
  ExecutorSection executor;
  KvCacheSection kv_cache;
  KvStoreSection kv_store;
  LeanKvSection leankv;
  FreeKvSection freekv;
  SchedulerSection scheduler;
  ServerSection server;
  SamplingSection sampling;
  LoggingSection logging;

  // Every section's validate(), in this order, then the constraints between sections
  // (kv_cache.gpu_memory_fraction needs a non-CPU device). INVALID_ARGUMENT naming the key.
  Status validate() const;
  bool operator==(const DeploymentConfig&) const = default;
};

// Every key of the tree, dotted ("scheduler.max_num_seqs"), section by section in default.yaml's
// order. The loader's allowed-key lists come from here.
const std::vector<std::string_view>& config_keys();

// Checks one key's own constraints (range, format), with the message validate() gives for it,
// ignoring the constraints between keys. INVALID_ARGUMENT naming the key; NOT_FOUND if
// `dotted_key` is not a key of the tree. Used by apply_override().
Status validate_key(const DeploymentConfig& config, std::string_view dotted_key);

// YAML spellings of the enum values ("auto", "bfloat16", "llama3" ("" for kNone), "scheduler_aware",
// "swap", "warn", "json"), as the loader reads and to_yaml() writes them.
std::string_view config_name(std::optional<DType> value);  // "auto" for nullopt
std::string_view config_name(ChatTemplateFallback value);
std::string_view config_name(executor::WeightStorage value);  // "quantized" | "dequantize"
std::string_view config_name(DeviceKind value);  // "auto" | "cpu" | "cuda"
std::string_view config_name(EvictionPolicy value);
std::string_view config_name(RestoreMode value);  // "load" | "krul" | "partial"
std::string_view config_name(LayerPairing value);  // "none" | "krul" | "minicache"
std::string_view config_name(PreemptionMode value);
std::string_view config_name(FreeKvMethod value);  // "retrieval" | "h2o"
std::string_view config_name(LogLevel value);
std::string_view config_name(LogFormat value);
std::string_view config_name(kernels::KernelBackend value);  // "strata" | "torch"
std::string_view config_name(CodecKind value);               // "identity" | "zstd"

// Byte sizes as the config files write them: a plain integer, or an integer with a unit suffix,
// optionally after one space: KiB MiB GiB TiB (powers of 1024) or KB MB GB TB (powers of 1000);
// "B" is bytes. Case-sensitive. nullopt for anything else, a negative number or an overflow.
std::optional<int64_t> parse_byte_size(std::string_view text);
// The exact inverse: the largest binary unit that divides `num_bytes` ("4GiB", "512MiB"), else
// the plain integer. REQUIRES: num_bytes >= 0.
std::string format_byte_size(int64_t num_bytes);

}  // namespace strata::config
