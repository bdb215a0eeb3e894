// Which implementation serves each custom op (private to the executor): on a CUDA device with
// executor.kernels: strata, the start-up self-check decides per op (a mismatch makes that op fall
// back to libtorch; `strata serve` logs it as an error); with executor.kernels: torch, or on the
// CPU, every op runs libtorch and the report says why.
#pragma once

#include <ATen/core/Tensor.h>

#include "strata/executor/executor.h"
#include "strata/kernels/kernel_selection.h"
#include "strata/model/model_config.h"

namespace strata::executor {

kernels::KernelReport choose_kernels(const model::ModelConfig& config,
                                     const ExecutorOptions& options, at::Device device,
                                     at::ScalarType dtype);

}  // namespace strata::executor
