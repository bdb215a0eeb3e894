#include "strata/config/config_loader.h"

#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "config_test_util.h"
#include "strata/config/deployment_config.h"

namespace strata::config {
namespace {

using namespace test_util;

// ---- shipped files -----------------------------------------------------------------------------

TEST(ConfigLoaderTest, DefaultYamlIsTheStructDefaultsOnCpuWithTheSmallModel) {
  StatusOr<DeploymentConfig> loaded = load_config_file(config_path("default.yaml"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  DeploymentConfig expected = with_path(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  expected.model.dtype = DType::kFloat32;
  expected.devices.device.kind = DeviceKind::kCpu;
  // The store is off unless configured; default.yaml turns it on with small tiers.
  expected.kv_store.dram_bytes = int64_t{512} << 20;
  expected.kv_store.ssd_dir = ".cache/kv-store";
  expected.kv_store.ssd_bytes = int64_t{2} << 30;
  // Prompts that fill the context window are rejected unless configured; default.yaml truncates.
  expected.scheduler.overflow_truncation_fraction = 0.5;
  // Requests without sampling fields take llama.cpp's defaults instead of OpenAI's.
  expected.sampling.temperature = 0.8;
  expected.sampling.top_k = 40;
  expected.sampling.top_p = 0.95;
  expected.sampling.min_p = 0.05;
  EXPECT_EQ(*loaded, expected);
  EXPECT_EQ(loaded->server.host, "127.0.0.1");
  EXPECT_EQ(loaded->server.grpc_port, 50051);
  EXPECT_EQ(loaded->server.http_port, 8000);
  EXPECT_EQ(loaded->model.effective_served_name(), "SmolLM2-135M-Instruct.Q4_1");
}

TEST(ConfigLoaderTest, DefaultYamlWritesEveryKeyExactlyOnce) {
  const std::string text = read_text(config_path("default.yaml"));
  for (std::string_view dotted : config_keys()) {
    // Within the key's section: from its header to the next top-level line.
    const std::string section(dotted.substr(0, dotted.find('.')));
    const size_t begin = text.find("\n" + section + ":");
    ASSERT_NE(begin, std::string::npos) << section;
    size_t end = begin + 1;
    while ((end = text.find('\n', end)) != std::string::npos && end + 1 < text.size() &&
           (text[end + 1] == ' ' || text[end + 1] == '\n' || text[end + 1] == '#')) {
      ++end;
    }
    const std::string body = text.substr(begin, end == std::string::npos ? end : end - begin);
    const std::string line = "\n  " + std::string(dotted.substr(dotted.find('.') + 1)) + ":";
    size_t count = 0;
    for (size_t pos = body.find(line); pos != std::string::npos; pos = body.find(line, pos + 1)) {
      ++count;
    }
    EXPECT_EQ(count, 1u) << dotted;
  }
}

TEST(ConfigLoaderTest, SingleGpuYaml) {
  StatusOr<DeploymentConfig> loaded = load_config_file(config_path("single-gpu.yaml"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->devices.device.kind, DeviceKind::kCuda);
  EXPECT_EQ(loaded->devices.device.index, 0);
  EXPECT_EQ(loaded->model.dtype, DType::kBFloat16);
  EXPECT_EQ(loaded->kv_cache.gpu_memory_fraction, 0.9);
  EXPECT_FALSE(loaded->kv_cache.cache_bytes.has_value());
  EXPECT_EQ(loaded->kv_cache.host_cache_bytes, int64_t{8} << 30);
  EXPECT_EQ(loaded->scheduler.preemption_mode, PreemptionMode::kSwap);
  EXPECT_TRUE(loaded->kv_store.enabled());
  EXPECT_EQ(loaded->kv_store.dram_bytes, int64_t{64} << 30);
  EXPECT_EQ(loaded->kv_store.ssd_dir, "/var/lib/strata/kv-store");
  EXPECT_EQ(loaded->kv_store.ssd_bytes, int64_t{256} << 30);
  EXPECT_EQ(loaded->kv_store.eviction_policy, EvictionPolicy::kSchedulerAware);
}

TEST(ConfigLoaderTest, MultiA100Yaml) {
  StatusOr<DeploymentConfig> loaded = load_config_file(config_path("multi-a100.yaml"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->devices.tensor_parallel_size, 8);
  EXPECT_EQ(loaded->model.path, "/models/llama-3-70b-instruct");
  EXPECT_EQ(loaded->model.chat_template, ChatTemplateFallback::kLlama3);
  EXPECT_EQ(loaded->server.host, "0.0.0.0");
  EXPECT_TRUE(loaded->server.api_keys.empty());
  EXPECT_EQ(loaded->server.api_keys_env, "STRATA_API_KEYS");
  EXPECT_EQ(loaded->logging.format, LogFormat::kJson);
  EXPECT_EQ(loaded->kv_store.dram_bytes, int64_t{64} << 30);  // per rank
  EXPECT_EQ(loaded->kv_store.ssd_dir, "/raid/strata/kv-store");
  EXPECT_EQ(loaded->kv_store.ssd_bytes, int64_t{512} << 30);
  EXPECT_EQ(loaded->kv_store.ssd_file_bytes, int64_t{16} << 30);

  const EnvLookup env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "STRATA_API_KEYS") return " k1, k2 ,,";
    return std::nullopt;
  };
  StatusOr<std::vector<std::string>> keys = resolve_api_keys(loaded->server, env);
  ASSERT_TRUE(keys.ok()) << keys.status().to_string();
  EXPECT_EQ(*keys, (std::vector<std::string>{"k1", "k2"}));
}

TEST(ConfigLoaderTest, MissingFileIsNotFound) {
  StatusOr<DeploymentConfig> loaded = load_config_file(config_path("no-such.yaml"));
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
  EXPECT_NE(loaded.status().message().find("no-such.yaml"), std::string::npos);
}

// ---- defaults --------------------------------------------------------------------------------

TEST(ConfigLoaderTest, OnlyAModelPathGivesEveryDefault) {
  StatusOr<DeploymentConfig> loaded = parse_config("model:\n  path: m.gguf\n", "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(*loaded, with_path("m.gguf"));

  const DeploymentConfig& c = *loaded;
  EXPECT_EQ(c.model.dtype, std::nullopt);
  EXPECT_EQ(c.model.weights, executor::WeightStorage::kQuantized);
  EXPECT_EQ(c.model.chat_template, ChatTemplateFallback::kNone);
  EXPECT_EQ(c.model.served_name, "");
  EXPECT_EQ(c.devices.device.kind, DeviceKind::kAuto);
  EXPECT_EQ(c.devices.tensor_parallel_size, 1);
  EXPECT_EQ(c.devices.cpu_threads, 0);
  EXPECT_EQ(c.kv_cache.block_size_tokens, 16);
  EXPECT_FALSE(c.kv_cache.gpu_memory_fraction.has_value());
  EXPECT_FALSE(c.kv_cache.cache_bytes.has_value());
  EXPECT_EQ(c.kv_cache.host_cache_bytes, 0);
  EXPECT_TRUE(c.kv_cache.enable_prefix_caching);
  EXPECT_EQ(c.kv_store.dram_bytes, 0);
  EXPECT_FALSE(c.kv_store.enabled());
  EXPECT_EQ(c.kv_store.ssd_dir, "");
  EXPECT_EQ(c.kv_store.ssd_bytes, 0);
  EXPECT_EQ(c.kv_store.ssd_file_bytes, int64_t{1} << 30);
  EXPECT_TRUE(c.kv_store.direct_io);
  EXPECT_EQ(c.kv_store.eviction_policy, EvictionPolicy::kSchedulerAware);
  EXPECT_EQ(c.kv_store.io_threads, 2);
  EXPECT_EQ(c.kv_store.ttl_seconds, 3600);
  EXPECT_EQ(c.kv_store.dram_reserve_fraction, 0.1);
  EXPECT_EQ(c.kv_store.read_buffer_layers, -1);
  EXPECT_EQ(c.kv_store.restore_mode, store::RestoreMode::kLoad);
  EXPECT_EQ(c.scheduler.max_num_seqs, 64);
  EXPECT_EQ(c.scheduler.max_num_batched_tokens, 512);
  EXPECT_EQ(c.scheduler.preemption_mode, PreemptionMode::kRecompute);
  EXPECT_EQ(c.scheduler.max_queued_requests, 1024);
  EXPECT_EQ(c.scheduler.overflow_truncation_fraction, 0.0);
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.server.grpc_port, 50051);
  EXPECT_EQ(c.server.http_port, 8000);
  EXPECT_TRUE(c.server.api_keys.empty());
  EXPECT_EQ(c.server.api_keys_env, "");
  EXPECT_EQ(c.server.shutdown_grace_seconds, 30);
  EXPECT_EQ(c.server.request_timeout_seconds, 0);
  EXPECT_EQ(c.logging.level, LogLevel::kInfo);
  EXPECT_EQ(c.logging.format, LogFormat::kText);
  EXPECT_EQ(c.executor.kernels, strata::kernels::KernelBackend::kStrata);
}

TEST(ConfigLoaderTest, NullSectionsAndCommentsOnlyKeepDefaults) {
  StatusOr<DeploymentConfig> loaded =
      parse_config("# comment\nmodel: {path: m}\nserver:\nkv_store:\nlogging: ~\n", "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(*loaded, with_path("m"));
}

TEST(ConfigLoaderTest, EffectiveServedName) {
  const std::pair<std::string, std::string> cases[] = {
      {".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"},
      {"/models/llama-3-70b-instruct", "llama-3-70b-instruct"},
      {"/models/llama-3.1-8b/", "llama-3.1-8b"},
      {"model.gguf", "model"},
      {".gguf", ".gguf"},
  };
  for (const auto& [path, name] : cases) {
    ModelSection model;
    model.path = path;
    EXPECT_EQ(model.effective_served_name(), name) << path;
  }
  ModelSection named;
  named.path = "/models/x.gguf";
  named.served_name = "chat";
  EXPECT_EQ(named.effective_served_name(), "chat");
}

TEST(ConfigLoaderTest, ValidationErrorsNameTheKeyAndItsPosition) {
  expect_cases({
      {"max_num_seqs 0", "scheduler:\n  max_num_seqs: 0\n", kInvalid,
       "t.yaml:4:3: scheduler.max_num_seqs must be >= 1, got 0"},
      {"max_num_seqs 1", "scheduler:\n  max_num_seqs: 1\n", kOk, ""},
      {"max_num_batched_tokens 0", "scheduler: {max_num_batched_tokens: 0}\n", kInvalid,
       "scheduler.max_num_batched_tokens must be >= 1, got 0"},
      {"max_queued_requests 0", "scheduler: {max_queued_requests: 0}\n", kInvalid,
       "scheduler.max_queued_requests must be >= 1, got 0"},
      {"truncation 1.5", "scheduler:\n  overflow_truncation_fraction: 1.5\n", kInvalid,
       "t.yaml:4:3: scheduler.overflow_truncation_fraction must be in [0, 0.9], got 1.5"},
      {"truncation 0.95", "scheduler: {overflow_truncation_fraction: 0.95}\n", kInvalid,
       "scheduler.overflow_truncation_fraction must be in [0, 0.9], got 0.95"},
      {"truncation -0.1", "scheduler: {overflow_truncation_fraction: -0.1}\n", kInvalid,
       "scheduler.overflow_truncation_fraction must be in [0, 0.9], got -0.1"},
      {"truncation nan", "scheduler: {overflow_truncation_fraction: nan}\n", kInvalid,
       "scheduler.overflow_truncation_fraction must be in [0, 0.9], got nan"},
      {"truncation 0 rejects", "scheduler: {overflow_truncation_fraction: 0}\n", kOk, ""},
      {"truncation 0.9", "scheduler: {overflow_truncation_fraction: 0.9}\n", kOk, ""},
      {"truncation word", "scheduler: {overflow_truncation_fraction: half}\n", kInvalid,
       "scheduler.overflow_truncation_fraction: expected a number, got 'half'"},
      {"block size 0", "kv_cache: {block_size_tokens: 0}\n", kInvalid,
       "kv_cache.block_size_tokens must be a power of two in [1, 256], got 0"},
      {"block size 24", "kv_cache: {block_size_tokens: 24}\n", kInvalid,
       "kv_cache.block_size_tokens must be a power of two in [1, 256], got 24"},
      {"block size 512", "kv_cache: {block_size_tokens: 512}\n", kInvalid,
       "kv_cache.block_size_tokens must be a power of two in [1, 256], got 512"},
      {"block size 1", "kv_cache: {block_size_tokens: 1}\n", kOk, ""},
      // yaml-cpp passes such bytes through and writes them back as U+FFFD (found by config_fuzz).
      {"invalid UTF-8", "kv_store:\n  ssd_dir: /a/\xff\n", kInvalid,
       "t.yaml:4:15: not valid UTF-8"},
      {"raw control character",
       "kv_store:\n  ssd_dir: /a/\x13"
       "b\n",
       kInvalid, "t.yaml:4:15: control character U+0013 is not allowed in YAML"},
      {"block size 256", "kv_cache: {block_size_tokens: 256}\n", kOk, ""},
      {"fraction 0", "kv_cache: {gpu_memory_fraction: 0}\n", kInvalid,
       "kv_cache.gpu_memory_fraction must be in (0, 1], got 0"},
      {"fraction 1.5", "kv_cache: {gpu_memory_fraction: 1.5}\n", kInvalid,
       "kv_cache.gpu_memory_fraction must be in (0, 1], got 1.5"},
      {"fraction nan", "kv_cache: {gpu_memory_fraction: nan}\n", kInvalid,
       "kv_cache.gpu_memory_fraction must be in (0, 1], got nan"},
      {"fraction 1", "kv_cache: {gpu_memory_fraction: 1}\n", kOk, ""},
      {"fraction and bytes", "kv_cache: {gpu_memory_fraction: 0.5, cache_bytes: 1GiB}\n", kInvalid,
       "kv_cache.gpu_memory_fraction and kv_cache.cache_bytes are both set"},
      {"fraction on cpu", "devices: {device: cpu}\nkv_cache: {gpu_memory_fraction: 0.5}\n",
       kInvalid, "kv_cache.gpu_memory_fraction needs a cuda or auto device"},
      {"fraction on auto", "devices: {device: auto}\nkv_cache: {gpu_memory_fraction: 0.5}\n", kOk,
       ""},
      {"cache_bytes 0", "kv_cache: {cache_bytes: 0}\n", kInvalid,
       "kv_cache.cache_bytes must be >= 1, got 0"},
      {"host swap 0 disables", "kv_cache: {host_cache_bytes: 0}\n", kOk, ""},
      {"restore mode", "kv_store: {restore_mode: pyramid}\n", kInvalid, "kv_store.restore_mode"},
      {"recompute ratio 1.5", "kv_store: {recompute_ratio: 1.5}\n", kInvalid,
       "kv_store.recompute_ratio must be in [0, 1], got 1.5"},
      {"layer pairs without their codec", "kv_store: {dram_bytes: 1GiB, layer_pairing: krul}\n",
       kInvalid,
       "kv_store.layer_pairing pairs layers for the layer-merge codec: set kv_store.fixed_codec "
       "to layer-merge (or kv_store.adaptcache with a profile listing it)"},
      {"layer merge without pairs", "kv_store: {dram_bytes: 1GiB, fixed_codec: layer-merge}\n",
       kInvalid, "kv_store.fixed_codec layer-merge needs kv_store.layer_pairing krul or minicache"},
      {"lossy codecs with tensor parallelism",
       "devices: {tensor_parallel_size: 2}\nkv_store: {dram_bytes: 1GiB, fixed_codec: kivi-4}\n",
       kInvalid,
       "the KV store's lossy codecs and stored suffix (kv_store.adaptcache, fixed_codec, "
       "layer_pairing, stored_suffix) are not served with tensor parallelism yet"},
      {"stored suffix with tensor parallelism",
       "devices: {tensor_parallel_size: 2}\nkv_store: {dram_bytes: 1GiB, restore_mode: krul, "
       "stored_suffix: true}\n",
       kInvalid, "stored_suffix) are not served with tensor parallelism yet"},
      {"stored suffix", "kv_store: {dram_bytes: 1GiB, restore_mode: krul, stored_suffix: true}\n",
       kOk, ""},
      {"stored suffix without krul's restoration",
       "kv_store: {dram_bytes: 1GiB, restore_mode: partial, stored_suffix: true}\n", kInvalid,
       "kv_store.stored_suffix stores what Krul's restoration loads: it needs "
       "kv_store.restore_mode krul"},
      {"stored suffix with a lossy codec",
       "kv_store: {dram_bytes: 1GiB, restore_mode: krul, stored_suffix: true, fixed_codec: "
       "kivi-4}\n",
       kInvalid, "kv_store.stored_suffix stores what Krul's restoration loads"},
      {"stored suffix of merged layer pairs",
       "kv_store: {dram_bytes: 1GiB, restore_mode: krul, stored_suffix: true, fixed_codec: "
       "layer-merge, layer_pairing: krul}\n",
       kOk, ""},
      {"stored suffix with adaptcache",
       "kv_store: {dram_bytes: 1GiB, restore_mode: krul, stored_suffix: true, adaptcache: true, "
       "adaptcache_profile: p.json}\n",
       kInvalid, "fixed_codec none or layer-merge, adaptcache false"},
      {"minicache's layer merge",
       "kv_store: {dram_bytes: 1GiB, fixed_codec: layer-merge, layer_pairing: minicache}\n", kOk,
       ""},
      {"tp 0", "devices: {tensor_parallel_size: 0}\n", kInvalid,
       "devices.tensor_parallel_size must be >= 1, got 0"},
      {"tp 8 on cuda", "devices: {device: cuda, tensor_parallel_size: 8}\n", kOk, ""},
      {"tp 2 on cpu (Gloo)", "devices: {device: cpu, tensor_parallel_size: 2}\n", kOk, ""},
      {"tp 3 on 2 nodes", "devices: {tensor_parallel_size: 3, nodes: 2, master_port: 29500}\n",
       kInvalid, "devices.tensor_parallel_size 3 does not divide among 2 devices.nodes"},
      {"node rank past nodes",
       "devices: {tensor_parallel_size: 2, nodes: 2, node_rank: 2, master_port: 29500}\n", kInvalid,
       "devices.node_rank 2 must be below devices.nodes 2"},
      {"2 nodes, no port", "devices: {tensor_parallel_size: 4, nodes: 2}\n", kInvalid,
       "devices.master_port: ranks on several machines meet at master_address:master_port"},
      {"master port 70000", "devices: {master_port: 70000}\n", kInvalid,
       "devices.master_port must be in [0, 65535], got 70000"},
      {"collective timeout 0", "devices: {collective_timeout_seconds: 0}\n", kInvalid,
       "devices.collective_timeout_seconds must be >= 1, got 0"},
      {"threads -1", "devices: {cpu_threads: -1}\n", kInvalid,
       "devices.cpu_threads must be >= 0, got -1"},
      {"grpc port 70000", "server: {grpc_port: 70000}\n", kInvalid,
       "server.grpc_port must be in [0, 65535] (0 disables), got 70000"},
      {"http port -1", "server: {http_port: -1}\n", kInvalid,
       "server.http_port must be in [0, 65535] (0 disables), got -1"},
      {"both ports 0", "server: {grpc_port: 0, http_port: 0}\n", kOk, ""},
      {"same ports", "server: {grpc_port: 9000, http_port: 9000}\n", kInvalid,
       "server.http_port must differ from server.grpc_port, both are 9000"},
      {"empty host", "server: {host: ''}\n", kInvalid, "server.host must be a non-empty address"},
      {"empty api key", "server: {api_keys: [a, '']}\n", kInvalid,
       "server.api_keys[1] must be non-empty"},
      {"api keys and env", "server: {api_keys: [a], api_keys_env: KEYS}\n", kInvalid,
       "server.api_keys_env and server.api_keys are both set"},
      {"bad env name", "server: {api_keys_env: 'MY-KEYS'}\n", kInvalid,
       "server.api_keys_env must be an environment variable name"},
      {"negative grace", "server: {shutdown_grace_seconds: -1}\n", kInvalid,
       "server.shutdown_grace_seconds must be >= 0, got -1"},
      {"negative timeout", "server: {request_timeout_seconds: -5}\n", kInvalid,
       "server.request_timeout_seconds must be >= 0, got -5"},
      {"no connections", "server: {max_connections: 0}\n", kInvalid,
       "server.max_connections must be >= 1, got 0"},
      {"served name with space", "model: {path: m, served_name: 'a b'}\n", kInvalid,
       "model.served_name must not contain spaces"},
  });
}

TEST(ConfigLoaderTest, ModelPathIsRequired) {
  const char* texts[] = {"", "# nothing\n", "model:\n  dtype: float32\n", "model: {path: ''}\n"};
  for (const char* text : texts) {
    StatusOr<DeploymentConfig> loaded = parse_config(text, "t.yaml");
    EXPECT_EQ(loaded.status().code(), kInvalid) << text;
    EXPECT_NE(loaded.status().message().find("model.path is required"), std::string::npos)
        << loaded.status().message();
  }
}

TEST(ConfigLoaderTest, ValidateWorksOnStructsBuiltInCode) {
  DeploymentConfig config = with_path("m");
  EXPECT_TRUE(config.validate().ok());
  config.scheduler.max_num_seqs = 0;
  EXPECT_EQ(config.validate().message(), "scheduler.max_num_seqs must be >= 1, got 0");
  config.scheduler.max_num_seqs = 1;
  config.devices.device.index = 2;  // without device cuda
  EXPECT_EQ(config.validate().message(),
            "devices.device: a CUDA device index (2) needs device cuda, got auto");
  EXPECT_EQ(validate_key(config, "devices.nope").code(), StatusCode::kNotFound);
  EXPECT_TRUE(validate_key(config, "scheduler.max_num_seqs").ok());
  config.devices.device.index = 0;
  config.scheduler.overflow_truncation_fraction = 1;
  EXPECT_EQ(config.validate().message(),
            "scheduler.overflow_truncation_fraction must be in [0, 0.9], got 1");
  EXPECT_EQ(validate_key(config, "scheduler.overflow_truncation_fraction").message(),
            "scheduler.overflow_truncation_fraction must be in [0, 0.9], got 1");
  config.scheduler.overflow_truncation_fraction = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(validate_key(config, "scheduler.overflow_truncation_fraction").message(),
            "scheduler.overflow_truncation_fraction must be in [0, 0.9], got nan");
  config.scheduler.overflow_truncation_fraction = 0.9;
  EXPECT_TRUE(config.validate().ok()) << config.validate().to_string();
}

TEST(ConfigLoaderTest, OverflowTruncationFractionIsRead) {
  StatusOr<DeploymentConfig> loaded = parse_config(
      "model: {path: m}\nscheduler:\n  overflow_truncation_fraction: 0.25\n", "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->scheduler.overflow_truncation_fraction, 0.25);
  // The other keys keep their defaults.
  DeploymentConfig expected = with_path("m");
  expected.scheduler.overflow_truncation_fraction = 0.25;
  EXPECT_EQ(*loaded, expected);
}

// ---- unknown keys and structure ---------------------------------------------------------------

TEST(ConfigLoaderTest, UnknownKeysNameTheFullPathAndListTheAllowedOnes) {
  expect_cases({
      {"top level", "modle: {}\n", kInvalid,
       "t.yaml:3:1: unknown key 'modle'; allowed top-level keys: model, devices, executor, "
       "kv_cache, kv_store, leankv, freekv, scheduler, server, sampling, logging"},
      {"model", "model: {path: m, dtyp: float32}\n", kInvalid,
       "unknown key 'model.dtyp'; allowed keys in 'model': path, dtype, weights, chat_template, "
       "chat_template_file, "
       "served_name"},
      {"devices", "devices:\n  gpus: 2\n", kInvalid,
       "t.yaml:4:3: unknown key 'devices.gpus'; allowed keys in 'devices': device, "
       "tensor_parallel_size, nodes, node_rank, master_address, master_port, "
       "collective_timeout_seconds, cpu_threads"},
      {"kv_cache", "kv_cache: {swap_bytes: 1GiB}\n", kInvalid,
       "unknown key 'kv_cache.swap_bytes'; allowed keys in 'kv_cache': block_size_tokens, "
       "gpu_memory_fraction, cache_bytes, host_cache_bytes, enable_prefix_caching"},
      {"kv_store", "kv_store:\n  ssd_path: /x\n", kInvalid,
       "t.yaml:4:3: unknown key 'kv_store.ssd_path'; allowed keys in 'kv_store': dram_bytes, "
       "ssd_dir, ssd_bytes, ssd_file_bytes, direct_io, ssd_bandwidth_limit, ssd_codec, "
       "eviction_policy, io_threads, "
       "ttl_seconds, "
       "dram_reserve_fraction, read_buffer_layers"},
      {"scheduler", "scheduler: {max_num_seq: 3}\n", kInvalid,
       "unknown key 'scheduler.max_num_seq'; allowed keys in 'scheduler': max_num_seqs, "
       "max_num_batched_tokens, preemption_mode, max_queued_requests, "
       "overflow_truncation_fraction"},
      {"server", "server: {port: 1}\n", kInvalid,
       "unknown key 'server.port'; allowed keys in 'server': host, grpc_port, http_port, "
       "api_keys, api_keys_env, shutdown_grace_seconds, request_timeout_seconds, max_connections"},
      {"logging", "logging: {file: x}\n", kInvalid,
       "unknown key 'logging.file'; allowed keys in 'logging': level, format"},
      {"non-string key", "scheduler: {[a]: 1}\n", kInvalid, "unknown key 'scheduler.a list'"},
      {"repeated key", "scheduler:\n  max_num_seqs: 1\n  max_num_seqs: 2\n", kInvalid,
       "t.yaml:5:3: 'scheduler.max_num_seqs' is set twice"},
      {"repeated section", "scheduler: {}\nscheduler: {}\n", kInvalid, "'scheduler' is set twice"},
  });
}

TEST(ConfigLoaderTest, MalformedYamlAndDocumentShape) {
  const std::pair<std::string, std::string> cases[] = {
      {"model: [unclosed\n", "t.yaml:2:1: invalid YAML"},
      {"model:\n\tpath: x\n", "invalid YAML"},
      {"- a\n- b\n", "expected a map of sections"},
      {"just a string\n", "expected a map of sections"},
      {"model: {path: m}\n---\nmodel: {path: n}\n", "t.yaml:2:1: expected one YAML document"},
      // yaml-cpp 0.7's LoadAll never returned on these (found by config_fuzz).
      {",", "t.yaml:1:1: invalid YAML"},
      {"model: {path: m}\n,\n", "invalid YAML"},
  };
  for (const auto& [text, part] : cases) {
    StatusOr<DeploymentConfig> loaded = parse_config(text, "t.yaml");
    EXPECT_EQ(loaded.status().code(), kInvalid) << text;
    EXPECT_NE(loaded.status().message().find(part), std::string::npos) << loaded.status().message();
  }
}

// ---- types -------------------------------------------------------------------------------------

TEST(ConfigLoaderTest, WrongTypesNameTheKeyAndTheExpectedType) {
  expect_cases({
      {"int from word", "scheduler:\n  max_num_seqs: many\n", kInvalid,
       "t.yaml:4:17: scheduler.max_num_seqs: expected an integer, got 'many'"},
      {"int from float", "scheduler: {max_num_seqs: 1.5}\n", kInvalid,
       "scheduler.max_num_seqs: expected an integer, got '1.5'"},
      {"int from hex", "scheduler: {max_num_seqs: 0x10}\n", kInvalid,
       "scheduler.max_num_seqs: expected an integer, got '0x10'"},
      {"int from list", "scheduler: {max_num_seqs: [1]}\n", kInvalid,
       "scheduler.max_num_seqs: expected an integer, got a list"},
      {"int from null", "scheduler: {max_num_seqs: }\n", kInvalid,
       "scheduler.max_num_seqs: expected an integer, got null"},
      {"int32 overflow", "scheduler: {max_num_seqs: 3000000000}\n", kInvalid,
       "scheduler.max_num_seqs: expected an integer in [-2147483648, 2147483647]"},
      {"int64 overflow", "scheduler: {max_num_batched_tokens: 99999999999999999999}\n", kInvalid,
       "scheduler.max_num_batched_tokens: expected a 64-bit integer"},
      {"bool from yes", "kv_cache: {enable_prefix_caching: yes}\n", kInvalid,
       "kv_cache.enable_prefix_caching: expected a boolean (true or false), got 'yes'"},
      {"bool False", "kv_cache: {enable_prefix_caching: False}\n", kOk, ""},
      {"number from word", "kv_cache: {gpu_memory_fraction: most}\n", kInvalid,
       "kv_cache.gpu_memory_fraction: expected a number, got 'most'"},
      {"string from map", "model: {path: {a: 1}}\n", kInvalid,
       "model.path: expected a string, got a map"},
      {"list from string", "server: {api_keys: k1}\n", kInvalid,
       "server.api_keys: expected a list of strings, got 'k1'"},
      {"list item from map", "server: {api_keys: [k1, {a: b}]}\n", kInvalid,
       "server.api_keys[1]: expected a string, got a map"},
      {"section from scalar", "scheduler: 5\n", kInvalid, "scheduler: expected a map, got '5'"},
      {"bad byte size", "kv_cache: {cache_bytes: 4GB2}\n", kInvalid,
       "kv_cache.cache_bytes: expected a byte size (an integer, optionally followed by KiB"},
      {"negative byte size", "kv_cache: {host_cache_bytes: -1}\n", kInvalid,
       "kv_cache.host_cache_bytes: expected a byte size"},
      {"optional null", "kv_cache: {cache_bytes: null, gpu_memory_fraction: ~}\n", kOk, ""},
      {"required null", "kv_cache: {host_cache_bytes: null}\n", kInvalid,
       "kv_cache.host_cache_bytes: expected a byte size"},
      {"dtype", "model: {path: m, dtype: fp16}\n", kInvalid,
       "model.dtype: expected one of auto, float32, bfloat16, float16, got 'fp16'"},
      {"weights", "model: {path: m, weights: int4}\n", kInvalid,
       "model.weights: expected one of quantized, dequantize, got 'int4'"},
      {"chat template", "model: {path: m, chat_template: vicuna}\n", kInvalid,
       "model.chat_template: expected one of \"\", chatml, llama3, mistral, got 'vicuna'"},
      {"device", "devices: {device: gpu}\n", kInvalid,
       "devices.device: expected one of auto, cpu, cuda, cuda:N, got 'gpu'"},
      {"device cuda:", "devices: {device: 'cuda:'}\n", kInvalid, "devices.device: expected"},
      {"device cuda:-1", "devices: {device: 'cuda:-1'}\n", kInvalid, "devices.device: expected"},
      {"device cuda:1x", "devices: {device: 'cuda:1x'}\n", kInvalid, "devices.device: expected"},
      {"preemption", "scheduler: {preemption_mode: evict}\n", kInvalid,
       "scheduler.preemption_mode: expected one of recompute, swap, got 'evict'"},
      {"log level", "logging: {level: verbose}\n", kInvalid,
       "logging.level: expected one of trace, debug, info, warn, error, got 'verbose'"},
      {"log format", "logging: {format: xml}\n", kInvalid,
       "logging.format: expected one of text, json, got 'xml'"},
      {"kernels", "executor: {kernels: cublas}\n", kInvalid,
       "executor.kernels: expected one of strata, torch, got 'cublas'"},
      {"plain number as string", "model: {path: 123}\n", kOk, ""},
  });
}

TEST(ConfigLoaderTest, DeviceSpellings) {
  const std::tuple<std::string, DeviceKind, int32_t> cases[] = {
      {"auto", DeviceKind::kAuto, 0},   {"cpu", DeviceKind::kCpu, 0},
      {"cuda", DeviceKind::kCuda, 0},   {"cuda:0", DeviceKind::kCuda, 0},
      {"cuda:7", DeviceKind::kCuda, 7},
  };
  for (const auto& [text, kind, index] : cases) {
    StatusOr<DeploymentConfig> loaded =
        parse_config("model: {path: m}\ndevices: {device: '" + text + "'}\n", "t.yaml");
    ASSERT_TRUE(loaded.ok()) << text << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->devices.device.kind, kind) << text;
    EXPECT_EQ(loaded->devices.device.index, index) << text;
  }
  DevicesSection devices;
  devices.device.kind = DeviceKind::kCuda;
  devices.device.index = 3;
  EXPECT_EQ(device_config_name(devices), "cuda:3");
  devices.device.index = 0;
  EXPECT_EQ(device_config_name(devices), "cuda");
}

// ---- byte sizes -------------------------------------------------------------------------------

TEST(ConfigLoaderTest, ResolveApiKeys) {
  int calls = 0;
  const EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    ++calls;
    if (name == "EMPTY") return " , ";
    if (name == "KEYS") return "a,b";
    return std::nullopt;
  };
  ServerSection server;
  server.api_keys = {"inline"};
  StatusOr<std::vector<std::string>> keys = resolve_api_keys(server, env);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(*keys, std::vector<std::string>{"inline"});
  EXPECT_EQ(calls, 0);  // no variable named, none read

  server.api_keys.clear();
  server.api_keys_env = "KEYS";
  keys = resolve_api_keys(server, env);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(*keys, (std::vector<std::string>{"a", "b"}));

  server.api_keys_env = "UNSET";
  keys = resolve_api_keys(server, env);
  EXPECT_EQ(keys.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(keys.status().message().find("UNSET, which is not set"), std::string::npos);

  server.api_keys_env = "EMPTY";
  keys = resolve_api_keys(server, env);
  EXPECT_EQ(keys.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(keys.status().message().find("EMPTY, which holds no key"), std::string::npos);

  server.api_keys = {"inline"};  // both set: invalid
  keys = resolve_api_keys(server, env);
  EXPECT_EQ(keys.status().code(), kInvalid);
}

// ---- overrides --------------------------------------------------------------------------------

TEST(ConfigLoaderTest, OverridesSetOneKeyWithTheFileSpelling) {
  DeploymentConfig config = with_path("m");
  const std::pair<std::string, std::string> overrides[] = {
      {"scheduler.max_num_seqs", "32"},
      {"scheduler.preemption_mode", "swap"},
      {"scheduler.overflow_truncation_fraction", "0.25"},
      {"model.path", "/models/x # not a comment"},
      {"model.dtype", "bfloat16"},
      {"model.chat_template", "chatml"},
      {"devices.device", "cuda:1"},
      {"kv_cache.cache_bytes", "4GiB"},
      {"kv_cache.host_cache_bytes", "0"},
      {"kv_cache.enable_prefix_caching", "false"},
      {"kv_cache.max_context_tokens", "2048"},
      {"server.host", "::"},
      {"server.api_keys", "[k1, 'k2']"},
      {"logging.level", "debug"},
      {"executor.kernels", "torch"},
  };
  for (const auto& [key, value] : overrides) {
    const Status status = apply_override(config, key, value);
    EXPECT_TRUE(status.ok()) << key << "=" << value << ": " << status.to_string();
  }
  EXPECT_EQ(config.scheduler.max_num_seqs, 32);
  EXPECT_EQ(config.scheduler.preemption_mode, PreemptionMode::kSwap);
  EXPECT_EQ(config.scheduler.overflow_truncation_fraction, 0.25);
  EXPECT_EQ(config.model.path, "/models/x # not a comment");
  EXPECT_EQ(config.model.dtype, DType::kBFloat16);
  EXPECT_EQ(config.model.chat_template, ChatTemplateFallback::kChatML);
  EXPECT_EQ(config.devices.device.kind, DeviceKind::kCuda);
  EXPECT_EQ(config.devices.device.index, 1);
  EXPECT_EQ(config.kv_cache.cache_bytes, int64_t{4} << 30);
  EXPECT_FALSE(config.kv_cache.enable_prefix_caching);
  EXPECT_EQ(config.kv_cache.max_context_tokens, 2048);
  EXPECT_EQ(config.server.host, "::");
  EXPECT_EQ(config.server.api_keys, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_EQ(config.logging.level, LogLevel::kDebug);
  EXPECT_EQ(config.executor.kernels, strata::kernels::KernelBackend::kTorch);
  EXPECT_TRUE(config.validate().ok()) << config.validate().to_string();

  // Empty clears a string key; null clears an optional key; [] empties a list.
  ASSERT_TRUE(apply_override(config, "model.chat_template", "").ok());
  EXPECT_EQ(apply_override(config, "kv_store.ssd_dir", "/a/\xff").message(),
            "override is not valid UTF-8");
  EXPECT_EQ(config.model.chat_template, ChatTemplateFallback::kNone);
  ASSERT_TRUE(apply_override(config, "kv_cache.cache_bytes", "null").ok());
  EXPECT_FALSE(config.kv_cache.cache_bytes.has_value());
  ASSERT_TRUE(apply_override(config, "server.api_keys", "[]").ok());
  EXPECT_TRUE(config.server.api_keys.empty());
}

TEST(ConfigLoaderTest, SamplingDefaults) {
  StatusOr<DeploymentConfig> loaded = parse_config(
      "model: {path: m}\nsampling: {temperature: 0.6, top_k: 20, repetition_penalty: 1.05, "
      "use_generation_config: false}\n",
      "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->sampling.temperature, 0.6);
  EXPECT_EQ(loaded->sampling.top_k, 20);
  EXPECT_EQ(loaded->sampling.repetition_penalty, 1.05);
  EXPECT_FALSE(loaded->sampling.top_p.has_value());
  EXPECT_FALSE(loaded->sampling.use_generation_config);
  EXPECT_EQ(loaded->sampling.describe(), "temperature=0.6 top_k=20 repetition_penalty=1.05");
  EXPECT_EQ(parse_config(to_yaml(*loaded), "round trip").value(), *loaded);
  DeploymentConfig config = *loaded;
  ASSERT_TRUE(apply_override(config, "sampling.temperature", "null").ok());
  EXPECT_FALSE(config.sampling.temperature.has_value());
  const StatusOr<DeploymentConfig> bad =
      parse_config("model: {path: m}\nsampling: {top_p: 1.5}\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sampling.top_p must be in (0, 1], got 1.5"),
            std::string::npos)
      << bad.status().message();
}

TEST(ConfigLoaderTest, BadOverridesAreRejectedAndLeaveTheConfigUnchanged) {
  const DeploymentConfig original = with_path("m");
  const struct {
    std::string key;
    std::string value;
    std::string message;  // exact
  } cases[] = {
      {"scheduler.max_num_seqs", "0", "scheduler.max_num_seqs must be >= 1, got 0"},
      {"scheduler.max_num_seqs", "lots", "scheduler.max_num_seqs: expected an integer, got 'lots'"},
      {"scheduler.max_num_seqs", "null", "scheduler.max_num_seqs: expected an integer, got 'null'"},
      {"scheduler.overflow_truncation_fraction", "1.5",
       "scheduler.overflow_truncation_fraction must be in [0, 0.9], got 1.5"},
      {"scheduler.overflow_truncation_fraction", "nan",
       "scheduler.overflow_truncation_fraction must be in [0, 0.9], got nan"},
      {"scheduler.overflow_truncation_fraction", "half",
       "scheduler.overflow_truncation_fraction: expected a number, got 'half'"},
      {"kv_cache.block_size_tokens", "48",
       "kv_cache.block_size_tokens must be a power of two in [1, 256], got 48"},
      {"kv_cache.gpu_memory_fraction", "2",
       "kv_cache.gpu_memory_fraction must be in (0, 1], got 2"},
      {"kv_cache.enable_prefix_caching", "on",
       "kv_cache.enable_prefix_caching: expected a boolean (true or false), got 'on'"},
      {"server.api_keys", "k1", "server.api_keys: expected a list of strings, got 'k1'"},
      {"server.api_keys", "[unclosed", ""},
      {"scheduler.max_num_seq", "1",
       "unknown key 'scheduler.max_num_seq'; allowed keys in 'scheduler': max_num_seqs, "
       "max_num_batched_tokens, preemption_mode, max_queued_requests, "
       "overflow_truncation_fraction"},
      {"scheduler.max_num_seqs.x", "1", ""},
      {"schedular.max_num_seqs", "1",
       "unknown key 'schedular.max_num_seqs'; allowed top-level keys: model, devices, executor, "
       "kv_cache, kv_store, leankv, freekv, scheduler, server, sampling, logging"},
      {"scheduler", "1",
       "'scheduler' is a section; override one of its keys: max_num_seqs, "
       "max_num_batched_tokens, preemption_mode, max_queued_requests, "
       "overflow_truncation_fraction"},
      {"", "1", ""},
  };
  for (const auto& c : cases) {
    DeploymentConfig config = original;
    const Status status = apply_override(config, c.key, c.value);
    EXPECT_EQ(status.code(), kInvalid) << c.key << "=" << c.value;
    if (!c.message.empty()) {
      EXPECT_EQ(status.message(), c.message);
    }
    EXPECT_EQ(config, original) << c.key << "=" << c.value;
  }
}

TEST(ConfigLoaderTest, OverridesLeaveConstraintsBetweenKeysToValidate) {
  StatusOr<DeploymentConfig> loaded = load_config_file(config_path("single-gpu.yaml"));
  ASSERT_TRUE(loaded.ok());
  DeploymentConfig config = *loaded;
  // Switching the pool from a fraction to bytes passes through "both set".
  ASSERT_TRUE(apply_override(config, "kv_cache.cache_bytes", "2GiB").ok());
  EXPECT_NE(config.validate().message().find("are both set"), std::string::npos);
  ASSERT_TRUE(apply_override(config, "kv_cache.gpu_memory_fraction", "~").ok());
  EXPECT_TRUE(config.validate().ok()) << config.validate().to_string();
}

// ---- round trip -------------------------------------------------------------------------------

DeploymentConfig everything_changed() {
  DeploymentConfig c;
  c.model.path = "/models/weird: \"quoted\" # path";
  c.model.dtype = DType::kFloat16;
  c.model.weights = executor::WeightStorage::kDequantize;
  c.model.chat_template = ChatTemplateFallback::kMistral;
  c.model.served_name = "null";
  c.devices.device.kind = DeviceKind::kCuda;
  c.devices.device.index = 5;
  c.devices.tensor_parallel_size = 4;
  c.devices.nodes = 2;
  c.devices.node_rank = 1;
  c.devices.master_address = "10.0.0.1";
  c.devices.master_port = 29500;
  c.devices.collective_timeout_seconds = 7;
  c.devices.cpu_threads = 12;
  c.executor.kernels = strata::kernels::KernelBackend::kTorch;
  c.kv_cache.block_size_tokens = 32;
  c.kv_cache.cache_bytes = (int64_t{3} << 30) + 7;
  c.kv_cache.host_cache_bytes = 1000000000;
  c.kv_cache.enable_prefix_caching = false;
  c.kv_cache.max_context_tokens = 4096;
  c.kv_store.dram_bytes = (int64_t{5} << 30) + 4096;
  c.kv_store.ssd_dir = "/mnt/nvme 0/kv: \"store\" # dir";
  c.kv_store.ssd_bytes = 300000000000;
  c.kv_store.ssd_file_bytes = int64_t{3} << 20;
  c.kv_store.direct_io = false;
  c.kv_store.ssd_bandwidth_limit = int64_t{200} << 20;
  c.kv_store.eviction_policy = EvictionPolicy::kFifo;
  c.kv_store.restore_mode = store::RestoreMode::kKrul;
  c.kv_store.recompute_ratio = 0.4;
  // (layer_pairing needs a lossy codec, which tensor parallelism below refuses.)
  c.kv_store.layer_share = 0.3;
  c.kv_store.krul_gamma = 0.7;
  c.kv_store.krul_row_stride = 4;
  c.kv_store.merge_retain = 0.1;
  c.kv_store.io_threads = 64;
  c.kv_store.ttl_seconds = 0;
  c.kv_store.dram_reserve_fraction = 0.9;
  c.scheduler.max_num_seqs = 7;
  c.scheduler.max_num_batched_tokens = 12345;
  c.scheduler.preemption_mode = PreemptionMode::kSwap;
  c.scheduler.max_queued_requests = 9;
  c.scheduler.overflow_truncation_fraction = 0.9;
  c.server.host = "0.0.0.0";
  c.server.grpc_port = 0;
  c.server.http_port = 65535;
  c.server.api_keys = {"true", "123", "sk-\xc3\xa9#:,[]"};
  c.server.shutdown_grace_seconds = 0;
  c.server.request_timeout_seconds = 86400;
  c.server.max_connections = 7;
  c.logging.level = LogLevel::kTrace;
  c.logging.format = LogFormat::kJson;
  return c;
}

TEST(ConfigLoaderTest, ToYamlRoundTrips) {
  std::vector<DeploymentConfig> configs = {with_path("m"), everything_changed()};
  DeploymentConfig fraction = with_path("m");
  fraction.kv_cache.gpu_memory_fraction = 0.1 + 0.2;  // not a short decimal
  fraction.kv_store.dram_reserve_fraction = 0.1 + 0.2;
  fraction.scheduler.overflow_truncation_fraction = 0.1 + 0.2;
  configs.push_back(fraction);
  for (const char* name :
       {"default.yaml", "single-gpu.yaml", "multi-a100.yaml", "llama3-8b-tp2-replicas.yaml"}) {
    StatusOr<DeploymentConfig> loaded = load_config_file(config_path(name));
    ASSERT_TRUE(loaded.ok()) << name;
    configs.push_back(*loaded);
  }
  for (const DeploymentConfig& config : configs) {
    ASSERT_TRUE(config.validate().ok()) << config.validate().to_string();
    const std::string yaml = to_yaml(config);
    StatusOr<DeploymentConfig> parsed = parse_config(yaml, "to_yaml");
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string() << "\n" << yaml;
    EXPECT_EQ(*parsed, config) << yaml;
  }
}

TEST(ConfigLoaderTest, ToYamlWritesEveryKey) {
  const std::string yaml = to_yaml(with_path("m"));
  for (std::string_view dotted : config_keys()) {
    const std::string_view key = dotted.substr(dotted.find('.') + 1);
    EXPECT_NE(yaml.find("\n  " + std::string(key) + ":"), std::string::npos) << dotted << "\n"
                                                                             << yaml;
  }
  EXPECT_NE(yaml.find("gpu_memory_fraction: ~"), std::string::npos) << yaml;
}

}  // namespace
}  // namespace strata::config
