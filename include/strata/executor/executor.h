// The executor runs the transformer forward pass for a ForwardBatch and owns the KV cache of each
// sequence it has seen (until the paged KV manager takes that over).
//
// Not thread-safe: one caller (the engine's step loop) drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/executor/forward_batch.h"
#include "strata/model/model_config.h"

namespace strata::model {
class ModelSource;
}

namespace strata::executor {

enum class DeviceKind { kCpu, kCuda };
enum class DType { kFloat32, kBFloat16, kFloat16 };

// "float32" | "bfloat16" | "float16" (also "fp32", "bf16", "fp16").
StatusOr<DType> parse_dtype(const std::string& name);
// "cpu" | "cuda" | "cuda:N"; "auto" picks cuda:0 when a GPU is present, else cpu.
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
};
StatusOr<Device> parse_device(const std::string& name);
const char* dtype_name(DType dtype);
std::string device_name(const Device& device);

struct ExecutorOptions {
  Device device;
  DType dtype = DType::kFloat32;
  int num_threads = 0;  // CPU intra-op threads; 0 keeps libtorch's default
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Loads and converts every weight of `source` to options.dtype on options.device.
  // FAILED_PRECONDITION if CUDA is requested without a device; other errors name the tensor.
  static StatusOr<std::unique_ptr<Executor>> create(const model::ModelSource& source,
                                                    const ExecutorOptions& options);

  virtual const model::ModelConfig& config() const = 0;
  virtual const ExecutorOptions& options() const = 0;

  // Runs one forward pass. INVALID_ARGUMENT (naming the sequence) for an empty chunk, a token id
  // outside the vocabulary, a sequence listed twice, or a sequence that would exceed
  // max_context_tokens; in that case no sequence changes. INTERNAL if libtorch fails.
  virtual StatusOr<ForwardResult> forward(const ForwardBatch& batch) = 0;

  // Forgets a sequence and frees its KV cache. Unknown ids are ignored.
  virtual void release(SeqId seq) = 0;
  // Tokens held for `seq` (0 if unknown).
  virtual int64_t num_cached_tokens(SeqId seq) const = 0;
};

}  // namespace strata::executor
