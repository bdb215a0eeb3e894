// The executor's configuration as the deployment file writes it: the devices, executor and
// kv_cache sections are these structs (config::DevicesSection and the others derive from them and
// add validation), and ExecutorOptions holds them as they are. Plain header: no libtorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/common/status.h"
#include "strata/kernels/kernel_selection.h"
#include "strata/kv/kv_format.h"

namespace strata::executor {

enum class DeviceKind {
  kAuto,  // cuda:0 when a GPU is present, else the CPU (resolved when the executor is created)
  kCpu,
  kCuda,
};

struct Device {
  DeviceKind kind = DeviceKind::kAuto;
  int32_t index = 0;  // N of cuda:N; 0 unless kind is kCuda
  bool operator==(const Device&) const = default;
};

// "auto" | "cpu" | "cuda" | "cuda:N" (N a decimal of at most 3 digits); INVALID_ARGUMENT
// otherwise. device_name() is its inverse ("cuda:0" for the first GPU, "auto", "cpu").
StatusOr<Device> parse_device(const std::string& name);
std::string device_name(const Device& device);

// How the weights a model file stores quantized (GGUF Q4_K, Q8_0, ...) are held: model.weights.
enum class WeightStorage {
  // Kept quantized and multiplied by libtorch's weight-only kernels (4-bit types as they are,
  // others as int8 rows: docs/quantized-weights.md), on the CPU and on CUDA; a form whose
  // kernel fails the start-up check on this device serves in the next form.
  kQuantized,
  kDequantize,  // converted to the compute dtype at load
};

struct DevicesConfig {
  Device device;
  // Ranks one model replica is split across (tensor parallelism, docs/tensor-parallelism.md): one
  // process and GPU per rank over NCCL on CUDA, one process per rank over Gloo on the CPU.
  int32_t tensor_parallel_size = 1;
  // Machines the ranks span (tensor_parallel_size divides evenly among them), this machine's
  // index, and where rank 0 hosts the rendezvous: master_port 0 on one machine uses a file
  // instead (no port needed).
  int32_t nodes = 1;
  int32_t node_rank = 0;
  std::string master_address = "127.0.0.1";
  int32_t master_port = 0;
  // A collective that has not completed by then means a rank died or hangs: the server reports
  // unhealthy and exits non-zero.
  int32_t collective_timeout_seconds = 30;
  int32_t cpu_threads = 0;  // CPU intra-op threads (per rank); 0 keeps libtorch's default
  bool operator==(const DevicesConfig&) const = default;
};

struct KernelsConfig {
  // kStrata: Strata's kernels (CUDA; on the CPU host loops for rms_norm, rotary, the KV-cache
  // write and decode attention), each after it passes the start-up self-check against libtorch
  // (an op that fails it runs libtorch); kTorch: libtorch for every op.
  kernels::KernelBackend kernels = kernels::KernelBackend::kStrata;
  bool operator==(const KernelsConfig&) const = default;
};

struct KvCacheConfig {
  int32_t block_size_tokens = 16;
  // The device pool's size: a fraction of the GPU memory left after the weights, or a byte count.
  // Neither: 90% of that memory on CUDA, four full contexts on the CPU.
  std::optional<double> gpu_memory_fraction;
  std::optional<int64_t> cache_bytes;
  int64_t host_cache_bytes = 0;  // host swap pool for preempted sequences; 0 disables swapping
  bool enable_prefix_caching = true;
  // The page format of every sequence's layers; nullopt: the compute dtype's (the base format the
  // kernels read). Another format shares the pool's pages (kv/page_layout.h) and is read and
  // written through the formats' libtorch reference.
  std::optional<kv::KvFormat> page_format;
  // Base blocks per page; 0: 1 with the base format only, 4 when page_format adds another.
  int32_t page_blocks = 0;
  // Caps the model's context window (vLLM's max_model_len): the longest sequence served, and the
  // one full context the pool must hold at least. 0: the model's.
  int64_t max_context_tokens = 0;
  bool operator==(const KvCacheConfig&) const = default;
};

// LeanKV (docs/leankv.md): sequences decode from mixed-precision, significance-tiered pages of
// their own pool; their prompt is computed in the KV pool as usual and compressed when it
// completes.
struct LeanKvConfig {
  bool enabled = false;
  double alpha_high = 1.0;  // high precision when score >= alpha_high / length
  double alpha_low = 0.02;  // low precision when score >= alpha_low / length; pruned below
  int32_t window = 64;      // most recent tokens kept in full precision
  int32_t high_key_bits = 8, high_value_bits = 4;  // 8, 4 or 2 each; low <= high
  int32_t low_key_bits = 4, low_value_bits = 2;
  int32_t high_tokens_per_page = 32;        // the page is the bytes of this many high tokens
  int64_t pool_bytes = int64_t{256} << 20;  // LeanKV's page pool
  int32_t max_sequences = 64;               // sequences holding LeanKV state at once
  bool operator==(const LeanKvConfig&) const = default;
};

// What the layers after the first attend once a sequence left the pool: FreeKV's retrieval (its
// synchronous and StreamingLLM baselines are settings of it), or H2O's static eviction.
enum class FreeKvMethod { kRetrieval, kH2o };

// FreeKV (docs/freekv.md): a sequence whose context reaches min_context_tokens leaves the KV pool
// and decodes by speculative retrieval: per layer (the first exact) and KV head it attends the
// first sink_tokens, the last window_tokens and the pages of page_tokens that its previous step's
// query selected, budget_tokens in all; a KV head whose query moved (cosine below tau) selects
// with the current one. method h2o (the static-eviction baseline, h2o_layer.h) keeps instead, per
// layer and KV head, the last window_tokens and the budget_tokens - window_tokens older tokens
// with the most attention received, evicting the rest for good (sink_tokens and tau unused,
// page_tokens only sizes the exact first layer); its sequences' attention is observed while the
// pool computes them. host_bytes bounds the memory of the sequences decoding by FreeKV at once:
// each reserves, when it leaves the pool, what a whole context of the model takes in its layers
// (freekv_runtime.h); a sequence that does not fit stays on the pool.
struct FreeKvConfig {
  bool enabled = false;
  FreeKvMethod method = FreeKvMethod::kRetrieval;
  int64_t page_tokens = 32;
  int64_t budget_tokens = 2048;
  int64_t sink_tokens = 512;
  int64_t window_tokens = 512;
  double tau = 0.8;
  int64_t min_context_tokens = 8192;
  int64_t host_bytes = int64_t{4} << 30;
  bool operator==(const FreeKvConfig&) const = default;
};

}  // namespace strata::executor
