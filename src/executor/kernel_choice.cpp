#include "kernel_choice.h"

#include "self_check.h"

namespace strata::executor {
namespace {

kernels::KernelReport all_torch(const std::string& why) {
  kernels::KernelReport report;
  for (kernels::KernelOp op : kernels::kAllKernelOps) {
    report.ops.push_back(
        {op, kernels::KernelBackend::kTorch, kernels::SelfCheckResult::kNotRun, 0.0, why});
  }
  return report;
}

}  // namespace

kernels::KernelReport choose_kernels(const model::ModelConfig& config,
                                     const ExecutorOptions& options, at::Device device,
                                     at::ScalarType dtype) {
  if (options.kernels == kernels::KernelBackend::kTorch) {
    return all_torch("executor.kernels: torch");
  }
  kernels::SelfCheckShape shape;
  shape.hidden = config.hidden_size;
  shape.num_heads = config.num_heads;
  shape.num_kv_heads = config.num_kv_heads;
  shape.head_dim = config.head_dim;
  shape.block_size = options.block_size_tokens;
  shape.dtype = dtype;
  shape.device = device;
  return kernels::run_kernel_self_check(kernels::torch_ops_table(kernels::KernelBackend::kStrata),
                                        kernels::torch_ops_table(kernels::KernelBackend::kTorch),
                                        shape);
}

}  // namespace strata::executor
