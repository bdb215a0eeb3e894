// The executor runs the transformer forward pass for a ForwardBatch. It owns the weights and the
// paged KV pool (the memory); which blocks belong to which sequence is the KV manager's business
// and arrives with each batch as page tables.
//
// Not thread-safe: one caller (the engine's step loop) drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/executor/forward_batch.h"
#include "strata/kernels/kernel_selection.h"
#include "strata/common/dtype.h"
#include "strata/kv/kv_types.h"
#include "strata/model/model_config.h"

namespace strata::model {
class ModelSource;
}

namespace strata::executor {

enum class DeviceKind { kCpu, kCuda };
// A compute dtype (strata::DType): "float32" | "bfloat16" | "float16" (also "fp32", "bf16",
// "fp16"); INVALID_ARGUMENT for anything else.
StatusOr<DType> parse_dtype(const std::string& name);
// "cpu" | "cuda" | "cuda:N"; "auto" picks cuda:0 when a GPU is present, else cpu.
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
};
StatusOr<Device> parse_device(const std::string& name);
std::string device_name(const Device& device);

struct ExecutorOptions {
  Device device;
  DType dtype = DType::kFloat32;
  int num_threads = 0;  // CPU intra-op threads; 0 keeps libtorch's default
  int32_t kv_block_size_tokens = 16;
  // Bytes of the KV pool. 0: on CUDA, kv_cache_memory_fraction of the device memory left after
  // the weights; on CPU, enough for max_context_tokens x 4 sequences.
  int64_t kv_cache_bytes = 0;
  double kv_cache_memory_fraction = 0.9;
  // Bytes of the host pool preempted sequences swap to (pinned when the device is CUDA);
  // 0 disables swapping.
  int64_t host_kv_cache_bytes = 0;
  // Page formats a sequence's layers may take besides the compute dtype's (kv::KvLayout); they
  // share the pool's pages (kv/page_layout.h) and are read and written through the formats'
  // libtorch reference.
  std::vector<kv::KvFormat> kv_formats;
  // Base blocks per page; 0: 1 when kv_formats adds no format, else 4.
  int32_t kv_page_blocks = 0;
  // Strata's CUDA kernels where the start-up self-check passes them (kStrata), or libtorch for
  // every op (kTorch). The CPU always runs libtorch.
  kernels::KernelBackend kernels = kernels::KernelBackend::kStrata;
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Loads and converts every weight of `source` to options.dtype on options.device, then
  // allocates the KV pool. FAILED_PRECONDITION if CUDA is requested without a device,
  // RESOURCE_EXHAUSTED if the pool cannot hold one full context; other errors name the tensor.
  static StatusOr<std::unique_ptr<Executor>> create(const model::ModelSource& source,
                                                    const ExecutorOptions& options);

  virtual const model::ModelConfig& config() const = 0;
  virtual const ExecutorOptions& options() const = 0;

  // Sets up the calling thread to run forward() (intra-op thread pool size and affinity); call it
  // once on that thread before its first forward(). Without it a thread other than the one that
  // created the executor may compute single-threaded.
  virtual void init_calling_thread() const = 0;

  // Shape of the KV pool, for the KV manager.
  virtual const kv::KvGeometry& kv_geometry() const = 0;
  virtual kv::KvFormat kv_format() const = 0;
  // Which implementation serves each custom op, and the self-check behind it.
  virtual const kernels::KernelReport& kernel_report() const = 0;

  // Bytes of one KV chunk, the KV store's unit (ForwardBatch::loads and saves): one token block of
  // every layer, [num_layers][2 (K, V)][num_kv_heads][block_size_tokens][head_dim] in the pool's
  // dtype, keys before RoPE (so they can be re-rotated to other positions).
  virtual int64_t kv_chunk_bytes() const = 0;
  // Forgets a sequence's pre-loaded layers (ForwardBatch::preloads) that no pass will use.
  virtual void drop_preload(SeqId seq) = 0;
  // Page-locks host memory that chunks are loaded from and saved to (no-op on the CPU).
  virtual void register_host_memory(void* data, size_t bytes) const = 0;
  virtual void unregister_host_memory(void* data) const = 0;

  // Runs one forward pass: performs the batch's copies and loads, writes the chunks' KV into the
  // pool, copies the saves out layer by layer and returns the requested logits; a batch without
  // chunks performs only its block copies. INVALID_ARGUMENT (naming the sequence) for an empty
  // chunk, a token id outside the vocabulary, a chunk past max_context_tokens, page tables that do
  // not cover it, a load that is not below its sequence's chunk or a save that does not end by
  // its end; nothing is written then. INTERNAL if libtorch fails.
  virtual StatusOr<ForwardResult> forward(const ForwardBatch& batch) = 0;
};

}  // namespace strata::executor
