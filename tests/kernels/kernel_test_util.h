// Shared helpers for CUDA kernel tests (label: gpu): skip without a device; dtype tolerances come
// from kernel_tolerance.h.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include "kernel_tolerance.h"

namespace strata::kernels::testing {

#define STRATA_SKIP_WITHOUT_CUDA()                                      \
  if (c10::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

}  // namespace strata::kernels::testing
