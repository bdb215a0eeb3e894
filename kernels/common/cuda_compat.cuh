// The one header through which kernel sources see CUDA, so that the same source compiles for a
// GPU with nvcc and for the CPU block emulator (tests/cuemu, docs/kernels/emulator.md) with the
// host compiler and -DSTRATA_CUEMU. Kernel sources follow two rules for that:
//   - launch with launch_kernel(kernel, {grid, block, dynamic_shared, stream}, args...) instead
//     of kernel<<<...>>>(args...);
//   - declare dynamic shared memory with STRATA_DYNAMIC_SHARED(type, name, alignment) instead of
//     `extern __shared__ __align__(alignment) type name[]`;
// and keep inline PTX in kernels/common/ptx.cuh, which has a functional model for the emulator.
// scripts/check_kernel_sources.py enforces the rules.
#pragma once

#if defined(STRATA_CUEMU)
#include "cuemu/cuemu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <utility>

#if defined(STRATA_CUEMU)
#define STRATA_DYNAMIC_SHARED(type, name, alignment) type* name = ::cuemu::dynamic_shared<type>()
#else
#define STRATA_DYNAMIC_SHARED(type, name, alignment) \
  extern __shared__ __align__(alignment) type name[]
#endif

namespace strata::kernels {

// Launch shape; file/line default to the launch site (named by emulator errors).
struct LaunchShape {
  LaunchShape(dim3 grid_, dim3 block_, size_t dynamic_shared_, cudaStream_t stream_,
              const char* file_ = __builtin_FILE(), int line_ = __builtin_LINE())
      : grid(grid_), block(block_), dynamic_shared(dynamic_shared_), stream(stream_),
        file(file_), line(line_) {}
  dim3 grid;
  dim3 block;
  size_t dynamic_shared;
  cudaStream_t stream;
  const char* file;
  int line;
};

// kernel<<<shape.grid, shape.block, shape.dynamic_shared, shape.stream>>>(args...), or the same
// launch run by the emulator. The caller checks cudaGetLastError() as after any launch.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), const LaunchShape& shape, Args&&... args) {
#if defined(STRATA_CUEMU)
  ::cuemu::launch(kernel, shape.grid, shape.block, shape.dynamic_shared, shape.stream, shape.file,
                  shape.line, std::forward<Args>(args)...);
#else
  kernel<<<shape.grid, shape.block, shape.dynamic_shared, shape.stream>>>(
      std::forward<Args>(args)...);
#endif
}

}  // namespace strata::kernels
