// The config's byte sizes and the kv_store and kv_cache sections: parsing, validation with the
// key's position, overrides.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>

#include "config_test_util.h"
#include "strata/config/config_loader.h"
#include "strata/config/deployment_config.h"

namespace strata::config {
namespace {

using namespace test_util;

TEST(ConfigSectionsTest, ParseByteSize) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::pair<std::string, std::optional<int64_t>> cases[] = {
      {"0", 0},
      {"1234", 1234},
      {"512B", 512},
      {"1KiB", 1024},
      {"512MiB", int64_t{512} << 20},
      {"4GiB", int64_t{4} << 30},
      {"4 GiB", int64_t{4} << 30},
      {"2TiB", int64_t{2} << 40},
      {"1KB", 1000},
      {"3MB", 3000000},
      {"2GB", 2000000000},
      {"1TB", 1000000000000},
      {std::to_string(kMax), kMax},
      {"", std::nullopt},
      {"GiB", std::nullopt},
      {"-1", std::nullopt},
      {"+1", std::nullopt},
      {"1.5GiB", std::nullopt},
      {"4gib", std::nullopt},
      {"4Gi", std::nullopt},
      {"4  GiB", std::nullopt},
      {"4 ", std::nullopt},
      {" 4", std::nullopt},
      {"8589934592GiB", std::nullopt},         // 2^33 GiB overflows
      {"99999999999999999999", std::nullopt},  // > int64
  };
  for (const auto& [text, bytes] : cases) {
    EXPECT_EQ(parse_byte_size(text), bytes) << "'" << text << "'";
  }
}

TEST(ConfigSectionsTest, FormatByteSizeIsExactAndParsesBack) {
  EXPECT_EQ(format_byte_size(0), "0");
  EXPECT_EQ(format_byte_size(1000), "1000");
  EXPECT_EQ(format_byte_size(1024), "1KiB");
  EXPECT_EQ(format_byte_size(int64_t{512} << 20), "512MiB");
  EXPECT_EQ(format_byte_size(int64_t{8} << 30), "8GiB");
  EXPECT_EQ(format_byte_size(int64_t{3} << 40), "3TiB");
  EXPECT_EQ(format_byte_size((int64_t{1} << 30) + 1024), "1048577KiB");
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1536}, int64_t{5} << 30,
                        std::numeric_limits<int64_t>::max()}) {
    EXPECT_EQ(parse_byte_size(format_byte_size(bytes)), bytes) << bytes;
  }
}

TEST(ConfigSectionsTest, ByteSizeKeysInTheFile) {
  StatusOr<DeploymentConfig> loaded = parse_config(
      "model: {path: m}\nkv_cache: {cache_bytes: 512MiB, host_cache_bytes: 10GB}\n", "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->kv_cache.cache_bytes, int64_t{512} << 20);
  EXPECT_EQ(loaded->kv_cache.host_cache_bytes, 10000000000);
}

// ---- kv_store ---------------------------------------------------------------------------------

TEST(ConfigSectionsTest, KvStoreSectionIsRead) {
  StatusOr<DeploymentConfig> loaded = parse_config(
      "model: {path: m}\n"
      "kv_store:\n"
      "  dram_bytes: 8GiB\n"
      "  ssd_dir: /mnt/nvme/kv\n"
      "  ssd_bytes: 100GB\n"
      "  ssd_file_bytes: 2GiB\n"
      "  direct_io: false\n"
      "  ssd_bandwidth_limit: 100MB\n"
      "  ssd_codec: zstd\n"
      "  eviction_policy: lru\n"
      "  io_threads: 16\n"
      "  ttl_seconds: 0\n"
      "  dram_reserve_fraction: 0.25\n"
      "  read_buffer_layers: 15\n",
      "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const KvStoreSection& store = loaded->kv_store;
  EXPECT_TRUE(store.enabled());
  EXPECT_EQ(store.dram_bytes, int64_t{8} << 30);
  EXPECT_EQ(store.ssd_dir, "/mnt/nvme/kv");
  EXPECT_EQ(store.ssd_bytes, 100000000000);
  EXPECT_EQ(store.ssd_file_bytes, int64_t{2} << 30);
  EXPECT_FALSE(store.direct_io);
  EXPECT_EQ(store.ssd_bandwidth_limit, 100000000);
  EXPECT_EQ(store.ssd_codec, CodecKind::kZstd);
  EXPECT_EQ(store.eviction_policy, EvictionPolicy::kLru);
  EXPECT_EQ(store.io_threads, 16);
  EXPECT_EQ(store.ttl_seconds, 0);
  EXPECT_EQ(store.dram_reserve_fraction, 0.25);
  EXPECT_EQ(store.read_buffer_layers, 15);
  // The other sections keep their defaults.
  DeploymentConfig expected = with_path("m");
  expected.kv_store = store;
  EXPECT_EQ(*loaded, expected);
}

TEST(ConfigSectionsTest, KvStoreIsOffWhenAbsentOrEmpty) {
  for (const char* text : {"model: {path: m}\n", "model: {path: m}\nkv_store:\n",
                           "model: {path: m}\nkv_store: {}\n"}) {
    StatusOr<DeploymentConfig> loaded = parse_config(text, "t.yaml");
    ASSERT_TRUE(loaded.ok()) << text << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->kv_store, KvStoreSection()) << text;
    EXPECT_FALSE(loaded->kv_store.enabled()) << text;
  }
}

TEST(ConfigSectionsTest, EvictionPolicySpellings) {
  const std::pair<std::string, EvictionPolicy> cases[] = {
      {"scheduler_aware", EvictionPolicy::kSchedulerAware},
      {"lru", EvictionPolicy::kLru},
      {"fifo", EvictionPolicy::kFifo},
  };
  for (const auto& [name, policy] : cases) {
    EXPECT_EQ(config_name(policy), name);
    StatusOr<DeploymentConfig> loaded =
        parse_config("model: {path: m}\nkv_store: {eviction_policy: " + name + "}\n", "t.yaml");
    ASSERT_TRUE(loaded.ok()) << name << ": " << loaded.status().to_string();
    EXPECT_EQ(loaded->kv_store.eviction_policy, policy) << name;
  }
}

TEST(ConfigSectionsTest, KvStoreValidationErrorsNameTheKeyAndItsPosition) {
  expect_cases({
      {"file bytes below 1MiB", "kv_store:\n  ssd_file_bytes: 512KiB\n", kInvalid,
       "t.yaml:4:3: kv_store.ssd_file_bytes must be >= 1MiB, got 512KiB"},
      {"file bytes 0", "kv_store: {ssd_file_bytes: 0}\n", kInvalid,
       "kv_store.ssd_file_bytes must be >= 1MiB, got 0"},
      {"file bytes 1MiB", "kv_store: {ssd_file_bytes: 1MiB}\n", kOk, ""},
      {"io threads 0", "kv_store:\n  io_threads: 0\n", kInvalid,
       "t.yaml:4:3: kv_store.io_threads must be in [1, 64], got 0"},
      {"io threads 65", "kv_store: {io_threads: 65}\n", kInvalid,
       "kv_store.io_threads must be in [1, 64], got 65"},
      {"io threads 1", "kv_store: {io_threads: 1}\n", kOk, ""},
      {"io threads 64", "kv_store: {io_threads: 64}\n", kOk, ""},
      {"ttl -1", "kv_store:\n  ttl_seconds: -1\n", kInvalid,
       "t.yaml:4:3: kv_store.ttl_seconds must be >= 0, got -1"},
      {"ttl 0 never expires", "kv_store: {ttl_seconds: 0}\n", kOk, ""},
      {"reserve 0.95", "kv_store:\n  dram_reserve_fraction: 0.95\n", kInvalid,
       "t.yaml:4:3: kv_store.dram_reserve_fraction must be in [0, 0.9], got 0.95"},
      {"reserve -0.1", "kv_store: {dram_reserve_fraction: -0.1}\n", kInvalid,
       "kv_store.dram_reserve_fraction must be in [0, 0.9], got -0.1"},
      {"reserve nan", "kv_store: {dram_reserve_fraction: nan}\n", kInvalid,
       "kv_store.dram_reserve_fraction must be in [0, 0.9], got nan"},
      {"read buffer -2", "kv_store: {read_buffer_layers: -2}\n", kInvalid,
       "kv_store.read_buffer_layers must be in [-1, 1024], got -2"},
      {"reserve 0", "kv_store: {dram_reserve_fraction: 0}\n", kOk, ""},
      {"reserve 0.9", "kv_store: {dram_reserve_fraction: 0.9}\n", kOk, ""},
      {"ssd dir with a newline", "kv_store: {ssd_dir: \"/mnt/a\\nb\"}\n", kInvalid,
       "kv_store.ssd_dir must not contain control characters"},
      {"ssd dir with a space", "kv_store: {ssd_dir: '/mnt/nvme 0/kv'}\n", kOk, ""},
      // Between keys, checked only while the store is on (dram_bytes > 0).
      {"ssd dir without bytes",
       "kv_store:\n  dram_bytes: 1GiB\n  ssd_dir: /mnt/kv\n  ssd_bytes: 0\n", kInvalid,
       "t.yaml:6:3: kv_store.ssd_bytes must be > 0 when kv_store.ssd_dir is set, got 0; set "
       "kv_store.ssd_dir to \"\" for no SSD tier"},
      {"ssd dir, bytes left out", "kv_store: {dram_bytes: 1GiB, ssd_dir: /mnt/kv}\n", kInvalid,
       "t.yaml: kv_store.ssd_bytes must be > 0 when kv_store.ssd_dir is set"},
      {"ssd bytes without dir", "kv_store:\n  dram_bytes: 1GiB\n  ssd_bytes: 10GiB\n", kInvalid,
       "t.yaml:5:3: kv_store.ssd_bytes is 10GiB but kv_store.ssd_dir is not set; set "
       "kv_store.ssd_dir, or kv_store.ssd_bytes to 0 for no SSD tier"},
      {"dram only", "kv_store: {dram_bytes: 1GiB}\n", kOk, ""},
      {"dram and ssd", "kv_store: {dram_bytes: 1GiB, ssd_dir: kv, ssd_bytes: 1GiB}\n", kOk, ""},
      {"store off ignores the ssd pair", "kv_store: {dram_bytes: 0, ssd_dir: /mnt/kv}\n", kOk, ""},
      // Wrong types.
      {"eviction policy", "kv_store:\n  eviction_policy: lfu\n", kInvalid,
       "t.yaml:4:20: kv_store.eviction_policy: expected one of scheduler_aware, lru, fifo, got "
       "'lfu'"},
      {"eviction policy case", "kv_store: {eviction_policy: LRU}\n", kInvalid,
       "kv_store.eviction_policy: expected one of scheduler_aware, lru, fifo, got 'LRU'"},
      {"dram bytes word", "kv_store: {dram_bytes: lots}\n", kInvalid,
       "kv_store.dram_bytes: expected a byte size (an integer, optionally followed by KiB"},
      {"dram bytes negative", "kv_store: {dram_bytes: -1}\n", kInvalid,
       "kv_store.dram_bytes: expected a byte size"},
      {"ssd bytes fractional", "kv_store: {ssd_bytes: 1.5TiB}\n", kInvalid,
       "kv_store.ssd_bytes: expected a byte size"},
      {"file bytes null", "kv_store: {ssd_file_bytes: ~}\n", kInvalid,
       "kv_store.ssd_file_bytes: expected a byte size"},
      {"ssd dir map", "kv_store: {ssd_dir: {a: 1}}\n", kInvalid,
       "kv_store.ssd_dir: expected a string, got a map"},
      {"direct io yes", "kv_store: {direct_io: yes}\n", kInvalid,
       "kv_store.direct_io: expected a boolean (true or false), got 'yes'"},
      {"io threads word", "kv_store: {io_threads: two}\n", kInvalid,
       "kv_store.io_threads: expected an integer, got 'two'"},
      {"ttl float", "kv_store: {ttl_seconds: 1.5}\n", kInvalid,
       "kv_store.ttl_seconds: expected an integer, got '1.5'"},
      {"reserve word", "kv_store: {dram_reserve_fraction: tenth}\n", kInvalid,
       "kv_store.dram_reserve_fraction: expected a number, got 'tenth'"},
      {"section from list", "kv_store: [a]\n", kInvalid, "kv_store: expected a map, got a list"},
      {"repeated key", "kv_store:\n  io_threads: 1\n  io_threads: 2\n", kInvalid,
       "t.yaml:5:3: 'kv_store.io_threads' is set twice"},
  });
}

TEST(ConfigSectionsTest, KvStoreValidateWorksOnStructsBuiltInCode) {
  KvStoreSection store;
  EXPECT_TRUE(store.validate().ok());
  store.dram_bytes = -1;
  EXPECT_EQ(store.validate().message(), "kv_store.dram_bytes must be >= 0, got -1");
  store.dram_bytes = int64_t{1} << 30;
  store.ssd_bytes = -5;
  EXPECT_EQ(store.validate().message(), "kv_store.ssd_bytes must be >= 0, got -5");
  store.ssd_bytes = 0;
  store.ssd_file_bytes = -1;
  EXPECT_EQ(store.validate().message(), "kv_store.ssd_file_bytes must be >= 1MiB, got -1");
  store.ssd_file_bytes = 1000;
  EXPECT_EQ(store.validate().message(), "kv_store.ssd_file_bytes must be >= 1MiB, got 1000");
  store.ssd_file_bytes = int64_t{1} << 20;
  EXPECT_TRUE(store.validate().ok());
  for (const char* address : {"127.0.0.1:6379", "[::1]:6379", "redis.internal:7000", "unix:/run/r.sock"}) {
    store.remote.address = address;
    EXPECT_TRUE(store.validate().ok()) << address;
  }
  store.adaptcache = {.enabled = true, .profile = "p.json"};
  EXPECT_EQ(store.validate().message(),
            "kv_store.remote_address: AdaptCache does not place conversations in the remote tier "
            "yet; set kv_store.adaptcache to false or kv_store.remote_address to \"\"");
  store.adaptcache = {};
  store.remote.address = "redis:";
  EXPECT_EQ(store.validate().message(),
            "kv_store.remote_address must be host:port or unix:/path, got 'redis:'");
  store.remote = {};

  DeploymentConfig config = with_path("m");
  config.kv_store.io_threads = 0;
  EXPECT_EQ(config.validate().message(), "kv_store.io_threads must be in [1, 64], got 0");
  EXPECT_EQ(validate_key(config, "kv_store.io_threads").message(),
            "kv_store.io_threads must be in [1, 64], got 0");
  EXPECT_TRUE(validate_key(config, "kv_store.ttl_seconds").ok());
  EXPECT_EQ(validate_key(config, "kv_store.nope").code(), StatusCode::kNotFound);
}

TEST(ConfigSectionsTest, KvStoreOverrides) {
  DeploymentConfig config = with_path("m");
  const std::pair<std::string, std::string> overrides[] = {
      {"kv_store.eviction_policy", "lru"},
      {"kv_store.dram_bytes", "16GiB"},
      {"kv_store.ssd_dir", "/mnt/nvme0/kv"},
      {"kv_store.ssd_bytes", "1TB"},
      {"kv_store.ssd_file_bytes", "256MiB"},
      {"kv_store.direct_io", "false"},
      {"kv_store.io_threads", "8"},
      {"kv_store.ttl_seconds", "0"},
      {"kv_store.dram_reserve_fraction", "0.2"},
  };
  for (const auto& [key, value] : overrides) {
    const Status status = apply_override(config, key, value);
    EXPECT_TRUE(status.ok()) << key << "=" << value << ": " << status.to_string();
  }
  KvStoreSection expected;
  expected.eviction_policy = EvictionPolicy::kLru;
  expected.dram_bytes = int64_t{16} << 30;
  expected.ssd_dir = "/mnt/nvme0/kv";
  expected.ssd_bytes = 1000000000000;
  expected.ssd_file_bytes = int64_t{256} << 20;
  expected.direct_io = false;
  expected.io_threads = 8;
  expected.ttl_seconds = 0;
  expected.dram_reserve_fraction = 0.2;
  EXPECT_EQ(config.kv_store, expected);
  EXPECT_TRUE(config.validate().ok()) << config.validate().to_string();
  ASSERT_TRUE(apply_override(config, "kv_store.eviction_policy", "fifo").ok());
  EXPECT_EQ(config.kv_store.eviction_policy, EvictionPolicy::kFifo);
  // An empty value clears the directory (the store then has no SSD tier once ssd_bytes is 0).
  ASSERT_TRUE(apply_override(config, "kv_store.ssd_dir", "").ok());
  EXPECT_EQ(config.kv_store.ssd_dir, "");
  // AdaptCache: a fixed codec (the static baselines), or the utility with its profile.
  ASSERT_TRUE(apply_override(config, "kv_store.fixed_codec", "kivi-2").ok());
  EXPECT_EQ(config.kv_store.adaptcache.fixed_codec, "kivi-2");
  ASSERT_TRUE(apply_override(config, "kv_store.fixed_codec", "streaming-0.25").ok());
  EXPECT_EQ(config.kv_store.adaptcache.fixed_codec, "streaming-0.25");
  ASSERT_TRUE(apply_override(config, "kv_store.fixed_codec", "none").ok());
  ASSERT_TRUE(apply_override(config, "kv_store.adaptcache_profile", "p.json").ok());
  ASSERT_TRUE(apply_override(config, "kv_store.adaptcache", "true").ok());
  ASSERT_TRUE(apply_override(config, "kv_store.adaptcache_alpha", "0.05").ok());
  EXPECT_EQ(config.kv_store.adaptcache,
            (store::AdaptCacheConfig{true, "none", 0.05, 600, "p.json"}));
  EXPECT_FALSE(apply_override(config, "kv_store.fixed_codec", "kivi-4").ok())
      << "a fixed codec is a baseline, not beside AdaptCache";

  const DeploymentConfig original = with_path("m");
  const struct {
    std::string key;
    std::string value;
    std::string message;  // exact
  } bad[] = {
      {"kv_store.eviction_policy", "lfu",
       "kv_store.eviction_policy: expected one of scheduler_aware, lru, fifo, got 'lfu'"},
      {"kv_store.io_threads", "0", "kv_store.io_threads must be in [1, 64], got 0"},
      {"kv_store.ssd_file_bytes", "4KiB", "kv_store.ssd_file_bytes must be >= 1MiB, got 4KiB"},
      {"kv_store.dram_reserve_fraction", "1",
       "kv_store.dram_reserve_fraction must be in [0, 0.9], got 1"},
      {"kv_store.ttl_seconds", "-1", "kv_store.ttl_seconds must be >= 0, got -1"},
      {"kv_store.dram_bytes", "null",
       "kv_store.dram_bytes: expected a byte size (an integer, optionally followed by KiB, MiB, "
       "GiB, TiB, KB, MB, GB or TB), got 'null'"},
      {"kv_store.fixed_codec", "kivi-3",
       "kv_store.fixed_codec must be none, kivi-8, kivi-4, kivi-2, streaming-0.5, streaming-0.25, "
       "streaming-0.1, layer-merge, h2o-0.5 or h2o-0.25, got 'kivi-3'"},
      {"kv_store.layer_pairing", "pairs",
       "kv_store.layer_pairing: expected one of none, krul, minicache, got 'pairs'"},
      {"kv_store.layer_share", "0", "kv_store.layer_share must be in (0, 1], got 0"},
      {"kv_store.krul_gamma", "1.5", "kv_store.krul_gamma must be in [0, 1], got 1.5"},
      {"kv_store.krul_row_stride", "0", "kv_store.krul_row_stride must be in [1, 4096], got 0"},
      {"kv_store.merge_retain", "-0.1", "kv_store.merge_retain must be in [0, 1], got -0.1"},
      {"kv_store.adaptcache", "true", "kv_store.adaptcache needs kv_store.adaptcache_profile"},
      {"kv_store.adaptcache_alpha", "-1", "kv_store.adaptcache_alpha must be >= 0, got -1"},
      {"kv_store.adaptcache_half_life_seconds", "0",
       "kv_store.adaptcache_half_life_seconds must be > 0, got 0"},
      {"kv_store.remote_address", "redis",
       "kv_store.remote_address must be host:port or "
       "unix:/path, got 'redis'"},
      {"kv_store.remote_timeout_ms", "0",
       "kv_store.remote_timeout_ms must be in [1, 60000], got 0"},
      {"kv_store.remote_bytes", "1KiB", "kv_store.remote_bytes must be >= 1MiB, got 1KiB"},
      {"kv_store.remote_password_env", "MY-PASS",
       "kv_store.remote_password_env must be an environment variable's name ([A-Za-z0-9_])"},
      {"kv_store.remote_codec", "lz4",
       "kv_store.remote_codec: expected one of identity, zstd, got 'lz4'"},
      {"kv_store.ssd_path", "/x",
       "unknown key 'kv_store.ssd_path'; allowed keys in 'kv_store': dram_bytes, ssd_dir, "
       "ssd_bytes, ssd_file_bytes, direct_io, ssd_bandwidth_limit, ssd_codec, eviction_policy, "
       "io_threads, ttl_seconds, dram_reserve_fraction, read_buffer_layers, restore_mode, "
       "recompute_ratio, stored_suffix, layer_pairing, layer_share, krul_gamma, krul_row_stride, "
       "merge_retain, "
       "adaptcache, fixed_codec, adaptcache_alpha, adaptcache_half_life_seconds, "
       "adaptcache_profile, remote_address, remote_username, remote_password_env, "
       "remote_database, remote_bytes, remote_max_item_bytes, remote_timeout_ms, remote_retry_ms, "
       "remote_ttl_seconds, "
       "remote_codec"},
      {"kv_store", "1",
       "'kv_store' is a section; override one of its keys: dram_bytes, ssd_dir, ssd_bytes, "
       "ssd_file_bytes, direct_io, ssd_bandwidth_limit, ssd_codec, eviction_policy, io_threads, "
       "ttl_seconds, dram_reserve_fraction, read_buffer_layers, restore_mode, recompute_ratio, "
       "stored_suffix, layer_pairing, layer_share, krul_gamma, krul_row_stride, merge_retain, "
       "adaptcache, "
       "fixed_codec, adaptcache_alpha, adaptcache_half_life_seconds, adaptcache_profile, "
       "remote_address, "
       "remote_username, remote_password_env, remote_database, remote_bytes, "
       "remote_max_item_bytes, remote_timeout_ms, remote_retry_ms, remote_ttl_seconds, "
       "remote_codec"},
  };
  for (const auto& c : bad) {
    DeploymentConfig changed = original;
    const Status status = apply_override(changed, c.key, c.value);
    EXPECT_EQ(status.code(), kInvalid) << c.key << "=" << c.value;
    EXPECT_EQ(status.message(), c.message);
    EXPECT_EQ(changed, original) << c.key << "=" << c.value;
  }
}

TEST(ConfigSectionsTest, KvStoreOverridesLeaveTheSsdPairToValidate) {
  DeploymentConfig config = with_path("m");
  ASSERT_TRUE(apply_override(config, "kv_store.dram_bytes", "1GiB").ok());
  // Adding an SSD tier passes through "directory without capacity".
  ASSERT_TRUE(apply_override(config, "kv_store.ssd_dir", "/mnt/kv").ok());
  EXPECT_EQ(config.validate().message(),
            "kv_store.ssd_bytes must be > 0 when kv_store.ssd_dir is set, got 0; set "
            "kv_store.ssd_dir to \"\" for no SSD tier");
  ASSERT_TRUE(apply_override(config, "kv_store.ssd_bytes", "64GiB").ok());
  EXPECT_TRUE(config.validate().ok()) << config.validate().to_string();
}

// ---- API keys ---------------------------------------------------------------------------------

// ---- kv_cache page formats ------------------------------------------------------------------

TEST(ConfigSectionsTest, PageFormatIsReadByNameAndWrittenBack) {
  StatusOr<DeploymentConfig> loaded = parse_config(
      "model: {path: m}\nkv_store: {dram_bytes: 0}\n"
      "kv_cache:\n  page_format: k:int8/token64,v:int4/token32\n  page_blocks: 8\n",
      "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  ASSERT_TRUE(loaded->kv_cache.page_format.has_value());
  EXPECT_EQ(kv::format_name(*loaded->kv_cache.page_format), "k:int8/token64,v:int4/token32");
  EXPECT_EQ(loaded->kv_cache.page_blocks, 8);
  StatusOr<DeploymentConfig> again = parse_config(to_yaml(*loaded), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, *loaded);
  // auto (and null) is the compute dtype's format.
  DeploymentConfig config = *loaded;
  ASSERT_TRUE(apply_override(config, "kv_cache.page_format", "auto").ok());
  EXPECT_FALSE(config.kv_cache.page_format.has_value());
}

TEST(ConfigSectionsTest, PageFormatErrorsNameTheKey) {
  expect_cases({
      {"unknown dtype", "kv_cache:\n  page_format: int3/token32\n", kInvalid,
       "t.yaml:4:16: kv_cache.page_format: expected auto or a page format"},
      {"page blocks 65", "kv_cache: {page_blocks: 65}\n", kInvalid,
       "kv_cache.page_blocks must be in [0, 64], got 65"},
      {"with the store", "kv_cache: {page_format: int8/token64}\nkv_store: {dram_bytes: 1GiB}\n",
       kInvalid, "kv_cache.page_format is int8/token64 but the KV store"},
      {"without the store", "kv_cache: {page_format: int4/channel}\n", kOk, ""},
  });
}

TEST(ConfigSectionsTest, LeanKvSectionIsReadWrittenBackAndOverridden) {
  StatusOr<DeploymentConfig> loaded = parse_config(
      "model: {path: m}\ndevices: {device: cpu}\nkv_store: {dram_bytes: 0}\n"
      "kv_cache: {enable_prefix_caching: false}\n"
      "leankv:\n  enabled: true\n  alpha_high: 3\n  alpha_low: 0.04\n  window: 32\n"
      "  high_value_bits: 8\n  low_key_bits: 2\n  pool_bytes: 64MiB\n  max_sequences: 8\n",
      "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const LeanKvSection& lean = loaded->leankv;
  EXPECT_TRUE(lean.enabled);
  EXPECT_EQ(lean.alpha_high, 3.0);
  EXPECT_EQ(lean.alpha_low, 0.04);
  EXPECT_EQ(lean.window, 32);
  EXPECT_EQ(lean.high_key_bits, 8);
  EXPECT_EQ(lean.high_value_bits, 8);
  EXPECT_EQ(lean.low_key_bits, 2);
  EXPECT_EQ(lean.low_value_bits, 2);
  EXPECT_EQ(lean.pool_bytes, int64_t{64} << 20);
  EXPECT_EQ(lean.max_sequences, 8);
  StatusOr<DeploymentConfig> again = parse_config(to_yaml(*loaded), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, *loaded);
  DeploymentConfig config = *loaded;
  ASSERT_TRUE(apply_override(config, "leankv.alpha_low", "0.1").ok());
  EXPECT_EQ(config.leankv.alpha_low, 0.1);
  EXPECT_FALSE(apply_override(config, "leankv.window", "0").ok());
}

TEST(ConfigSectionsTest, LeanKvErrorsNameTheKey) {
  const std::string on = "devices: {device: cpu}\nkv_store: {dram_bytes: 0}\n"
                         "kv_cache: {enable_prefix_caching: false}\n";
  expect_cases({
      {"bits 3", on + "leankv: {enabled: true, high_key_bits: 3}\n", kInvalid,
       "leankv.high_key_bits must be 8, 4 or 2, got 3"},
      {"low above high", on + "leankv: {enabled: true, high_value_bits: 2, low_value_bits: 4}\n",
       kInvalid, "low precision must not have more bits"},
      {"alphas", on + "leankv: {alpha_high: 0.01, alpha_low: 0.02}\n", kInvalid,
       "leankv.alpha_low (0.02) must not exceed leankv.alpha_high (0.01)"},
      {"small pool", on + "leankv: {pool_bytes: 1KiB}\n", kInvalid, "leankv.pool_bytes"},
      {"on cuda", "devices: {device: cuda}\nkv_store: {dram_bytes: 0}\n"
                  "kv_cache: {enable_prefix_caching: false}\nleankv: {enabled: true}\n",
       kInvalid, "leankv.enabled needs devices.device cpu"},
      {"prefix caching", "devices: {device: cpu}\nkv_store: {dram_bytes: 0}\n"
                         "leankv: {enabled: true}\n",
       kInvalid, "set kv_cache.enable_prefix_caching to false"},
      {"with the store", "devices: {device: cpu}\nkv_cache: {enable_prefix_caching: false}\n"
                         "kv_store: {dram_bytes: 1GiB}\nleankv: {enabled: true}\n",
       kInvalid, "leankv.enabled does not save to the KV store"},
      {"off, anything goes", "kv_store: {dram_bytes: 1GiB}\nleankv: {enabled: false}\n", kOk, ""},
      {"on", on + "leankv: {enabled: true}\n", kOk, ""},
  });
}

TEST(ConfigSectionsTest, FreeKvSectionIsReadWrittenBackAndOverridden) {
  StatusOr<DeploymentConfig> loaded = parse_config(
      "model: {path: m}\ndevices: {device: cpu}\nkv_store: {dram_bytes: 0}\n"
      "kv_cache: {enable_prefix_caching: false}\n"
      "freekv:\n  enabled: true\n  method: h2o\n  page_tokens: 16\n  budget_tokens: 1024\n  "
      "sink_tokens: 128\n"
      "  window_tokens: 256\n  tau: 0.9\n  min_context_tokens: 4096\n  host_bytes: 2GiB\n",
      "t.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const FreeKvSection& f = loaded->freekv;
  EXPECT_TRUE(f.enabled);
  EXPECT_EQ(f.method, FreeKvMethod::kH2o);
  EXPECT_EQ(f.page_tokens, 16);
  EXPECT_EQ(f.budget_tokens, 1024);
  EXPECT_EQ(f.sink_tokens, 128);
  EXPECT_EQ(f.window_tokens, 256);
  EXPECT_EQ(f.tau, 0.9);
  EXPECT_EQ(f.min_context_tokens, 4096);
  EXPECT_EQ(f.host_bytes, int64_t{2} << 30);
  StatusOr<DeploymentConfig> again = parse_config(to_yaml(*loaded), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, *loaded);
  DeploymentConfig config = *loaded;
  ASSERT_TRUE(apply_override(config, "freekv.tau", "2").ok());
  EXPECT_EQ(config.freekv.tau, 2.0);
  EXPECT_FALSE(apply_override(config, "freekv.sink_tokens", "100").ok());
  ASSERT_TRUE(apply_override(config, "freekv.method", "retrieval").ok());
  EXPECT_EQ(config.freekv.method, FreeKvMethod::kRetrieval);
  ASSERT_TRUE(apply_override(config, "freekv.host_bytes", "512MiB").ok());
  EXPECT_EQ(config.freekv.host_bytes, int64_t{512} << 20);
}

TEST(ConfigSectionsTest, FreeKvErrorsNameTheKey) {
  const std::string on = "devices: {device: cpu}\nkv_store: {dram_bytes: 0}\n"
                         "kv_cache: {enable_prefix_caching: false}\n";
  expect_cases({
      {"partial window", on + "freekv: {enabled: true, window_tokens: 500}\n", kInvalid,
       "freekv.window_tokens must be whole pages of freekv.page_tokens, got 500"},
      {"budget below sink and window", on + "freekv: {budget_tokens: 1000}\n", kInvalid,
       "freekv.budget_tokens (1000) must be at least freekv.sink_tokens + freekv.window_tokens"},
      {"streamingllm",
       on + "freekv: {enabled: true, budget_tokens: 1024, min_context_tokens: 2048}\n", kOk, ""},
      {"tau", on + "freekv: {tau: 3}\n", kInvalid, "freekv.tau must be in [-1, 2], got 3"},
      {"method", on + "freekv: {method: quest}\n", kInvalid,
       "freekv.method: expected one of retrieval, h2o, got 'quest'"},
      {"h2o without a window", on + "freekv: {method: h2o, sink_tokens: 0, window_tokens: 0}\n",
       kInvalid, "freekv.method h2o needs window_tokens >= 1 and budget_tokens (2048) above"},
      {"h2o all window",
       on + "freekv: {method: h2o, sink_tokens: 0, window_tokens: 2048, budget_tokens: 2048}\n",
       kInvalid, "freekv.method h2o needs window_tokens >= 1"},
      {"small host budget", on + "freekv: {host_bytes: 1KiB}\n", kInvalid,
       "freekv.host_bytes must be >= 1MiB"},
      {"threshold", on + "freekv: {min_context_tokens: 1000}\n", kInvalid,
       "freekv.min_context_tokens (1000) must be at least freekv.budget_tokens (2048)"},
      {"on cuda",
       "devices: {device: cuda}\nkv_store: {dram_bytes: 0}\n"
       "kv_cache: {enable_prefix_caching: false}\nfreekv: {enabled: true}\n",
       kOk, ""},
      {"with leankv", on + "leankv: {enabled: true}\nfreekv: {enabled: true}\n", kInvalid,
       "freekv.enabled and leankv.enabled exclude each other"},
      {"two ranks",
       "devices: {device: cpu, tensor_parallel_size: 2}\nkv_store: {dram_bytes: 0}\n"
       "kv_cache: {enable_prefix_caching: false}\nfreekv: {enabled: true}\n",
       kInvalid, "freekv.enabled serves one rank for now"},
      {"page format",
       "devices: {device: cpu}\nkv_store: {dram_bytes: 0}\n"
       "kv_cache: {enable_prefix_caching: false, page_format: int8/token64}\n"
       "freekv: {enabled: true}\n",
       kInvalid, "freekv.enabled reads the compute dtype's pages"},
      {"prefix caching",
       "devices: {device: cpu}\nkv_store: {dram_bytes: 0}\n"
       "freekv: {enabled: true}\n",
       kInvalid, "set kv_cache.enable_prefix_caching to false"},
      {"with the store",
       "devices: {device: cpu}\nkv_cache: {enable_prefix_caching: false}\n"
       "kv_store: {dram_bytes: 1GiB}\nfreekv: {enabled: true}\n",
       kOk, ""},
      {"restoring by recompute",
       "devices: {device: cpu}\nkv_cache: {enable_prefix_caching: false}\n"
       "kv_store: {dram_bytes: 1GiB, restore_mode: partial}\nfreekv: {enabled: true}\n",
       kInvalid, "freekv.enabled restores stored KV by loading it: set kv_store.restore_mode"},
      {"with layer pairs",
       "devices: {device: cpu}\nkv_cache: {enable_prefix_caching: false}\n"
       "kv_store: {dram_bytes: 1GiB, layer_pairing: minicache, fixed_codec: layer-merge}\n"
       "freekv: {enabled: true}\n",
       kInvalid, "kv_store.layer_pairing to none"},
      {"with H2O's codec",
       "devices: {device: cpu}\nkv_cache: {enable_prefix_caching: false}\n"
       "kv_store: {dram_bytes: 1GiB, fixed_codec: h2o-0.5}\nfreekv: {enabled: true}\n",
       kInvalid, "no h2o fixed_codec"},
      {"off, anything goes", "kv_store: {dram_bytes: 1GiB}\nfreekv: {enabled: false}\n", kOk, ""},
      {"on", on + "freekv: {enabled: true}\n", kOk, ""},
  });
}

}  // namespace
}  // namespace strata::config
