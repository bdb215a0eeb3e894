// Kernels for the emulator's own tests (contracts in test_kernels.h). Compiled for the emulator
// only, through the same portability headers as the real kernels.

#include "test_kernels.h"

#include <cmath>

#include "../../kernels/common/cuda_compat.cuh"
#include "../../kernels/common/ptx.cuh"

namespace cuemu_test {
namespace {

using strata::kernels::launch_kernel;

constexpr unsigned kFull = 0xffffffffu;

__global__ void __launch_bounds__(1024) reverse_kernel(float* out, const float* in, int n,
                                                       bool with_barrier) {
  __shared__ float s[1024];
  const int i = threadIdx.x;
  s[i] = in[i];
  if (with_barrier) __syncthreads();
  out[i] = s[n - 1 - i];
}

__global__ void __launch_bounds__(32) shuffle_partial_kernel(float* out, int lanes) {
  const int lane = threadIdx.x;
  if (lane >= lanes) return;
  out[lane] = __shfl_xor_sync(kFull, static_cast<float>(lane), 1);
}

__global__ void __launch_bounds__(32) shuffle_outside_kernel(float* out) {
  const int lane = threadIdx.x;
  if (lane < 16) out[lane] = __shfl_xor_sync(0x0000ffffu, static_cast<float>(lane), 16);
}

__global__ void __launch_bounds__(64) race_kernel(float* out) {
  __shared__ float s[64];
  const int t = threadIdx.x;
  s[t] = static_cast<float>(t);
  out[t] = s[(t + 32) % 64];
}

__global__ void __launch_bounds__(64) divergent_barrier_kernel(float* out) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void __launch_bounds__(32) warp_semantics_kernel(uint32_t* out) {
  const int lane = threadIdx.x;
  out[lane] = __shfl_sync(kFull, static_cast<uint32_t>(lane * 10), 5);
  out[32 + lane] = __shfl_up_sync(kFull, static_cast<uint32_t>(lane), 3);
  out[64 + lane] = __shfl_down_sync(kFull, static_cast<uint32_t>(lane), 3, 16);
  out[96 + lane] = __ballot_sync(kFull, lane % 2);
  const int any7 = __any_sync(kFull, lane == 7);
  const int all32 = __all_sync(kFull, lane < 32);
  const int all31 = __all_sync(kFull, lane < 31);
  if (lane == 0) {
    out[128] = static_cast<uint32_t>(any7);
    out[129] = static_cast<uint32_t>(all32);
    out[130] = static_cast<uint32_t>(all31);
  }
}

__global__ void __launch_bounds__(64) async_copy_kernel(float* out, const float* in, int n,
                                                        bool wait_before_read) {
  __shared__ __align__(16) float s[256];
  const int chunks = n / 4;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    strata::kernels::ptx::cp_async_16(s + 4 * c, in + 4 * c, true);
  }
  strata::kernels::ptx::cp_async_commit();
  if (wait_before_read) {
    strata::kernels::ptx::cp_async_wait<0>();
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = 2.0f * s[i];
  if (!wait_before_read) strata::kernels::ptx::cp_async_wait<0>();
}

__global__ void __launch_bounds__(32) bad_async_copy_kernel(float* dst, const float* src,
                                                             int mode) {
  __shared__ __align__(16) float s[4];
  strata::kernels::ptx::cp_async_16(mode == 0 ? dst : s, mode == 0 ? src : src + 1, true);
  strata::kernels::ptx::cp_async_commit();
  strata::kernels::ptx::cp_async_wait<0>();
}

__global__ void __launch_bounds__(64) unwritten_kernel(float* out, bool write) {
  __shared__ float s[64];
  if (write) s[threadIdx.x] = 1.0f;  // never: keeps the compiler from assuming s stays zero
  out[threadIdx.x] = s[threadIdx.x];
}

__global__ void __launch_bounds__(128) atomic_kernel(int* counter) { atomicAdd(counter, 1); }

__global__ void __launch_bounds__(32) trap_kernel_impl() {
  if (threadIdx.x == 3) __trap();
}

__global__ void __launch_bounds__(1024) shape_kernel(int* sink) {
  STRATA_DYNAMIC_SHARED(unsigned char, smem, 16);
  if (threadIdx.x == 0 && sink != nullptr) *sink = smem[0];
}

template <typename T>
__global__ void __launch_bounds__(32) mma_kernel(float* d, const float* a, const float* b) {
  __shared__ __align__(16) T sa[16][16];
  __shared__ __align__(16) T sb[16][8];
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) sa[i / 16][i % 16] = static_cast<T>(a[i]);
  for (int i = lane; i < 128; i += 32) sb[i / 8][i % 8] = static_cast<T>(b[i]);
  __syncwarp();
  // A as four 8x8 matrices: (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (0-7, 8-15), (8-15,
  // 8-15), so that r[0..3] are the a[0..3] registers of the fragment.
  uint32_t fa[4];
  const int m = lane / 8, row = lane % 8;
  strata::kernels::ptx::ldmatrix_x4(fa, &sa[row + 8 * (m % 2)][8 * (m / 2)]);
  // B (k x n, row-major) as two 8x8 matrices (k 0-7, k 8-15); .trans gives the col-major
  // fragment b[0] = B[2t..2t+1][g]. Lanes 16-31 repeat the addresses (x4 loads four).
  uint32_t fb4[4];
  strata::kernels::ptx::ldmatrix_x4_trans(fb4, &sb[row + 8 * (m % 2)][0]);
  const uint32_t fb[2] = {fb4[0], fb4[1]};
  const float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float out[4];
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, __nv_bfloat16>) {
    strata::kernels::ptx::mma_m16n8k16_bf16(out, fa, fb, c);
  } else {
    strata::kernels::ptx::mma_m16n8k16_f16(out, fa, fb, c);
  }
  const int g = lane / 4, t = lane % 4;
  for (int r = 0; r < 4; ++r) d[(g + 8 * (r / 2)) * 8 + 2 * t + r % 2] = out[r];
}

}  // namespace

void reverse_block(float* out, const float* in, int n, bool with_barrier) {
  launch_kernel(reverse_kernel, {1, static_cast<unsigned>(n), 0, nullptr}, out, in, n,
                with_barrier);
}

void shuffle_xor_partial_warp(float* out, int lanes) {
  launch_kernel(shuffle_partial_kernel, {1, 32, 0, nullptr}, out, lanes);
}

void shuffle_outside_mask(float* out) {
  launch_kernel(shuffle_outside_kernel, {1, 32, 0, nullptr}, out);
}

void cross_warp_race(float* out) { launch_kernel(race_kernel, {1, 64, 0, nullptr}, out); }

void divergent_barrier(float* out) {
  launch_kernel(divergent_barrier_kernel, {1, 64, 0, nullptr}, out);
}

void warp_semantics(uint32_t* out) {
  launch_kernel(warp_semantics_kernel, {1, 32, 0, nullptr}, out);
}

void async_copy_double(float* out, const float* in, int n, bool wait_before_read) {
  launch_kernel(async_copy_kernel, {1, 64, 0, nullptr}, out, in, n, wait_before_read);
}

void bad_async_copy(float* dst, const float* src, int mode) {
  launch_kernel(bad_async_copy_kernel, {1, 32, 0, nullptr}, dst, src, mode);
}

void read_unwritten_shared(float* out, int n) {
  launch_kernel(unwritten_kernel, {1, static_cast<unsigned>(n), 0, nullptr}, out, false);
}

void atomic_count(int* counter, int blocks) {
  launch_kernel(atomic_kernel, {static_cast<unsigned>(blocks), 128, 0, nullptr}, counter);
}

void trap_kernel() { launch_kernel(trap_kernel_impl, {1, 32, 0, nullptr}); }

void launch_with(int threads, int dynamic_shared, int raise_to) {
  if (raise_to > 0) {
    if (cudaFuncSetAttribute(shape_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             raise_to) != cudaSuccess) {
      throw cuemu::KernelFault("cudaFuncSetAttribute refused the limit");
    }
  }
  int sink = 0;
  launch_kernel(shape_kernel,
                {1, static_cast<unsigned>(threads), static_cast<size_t>(dynamic_shared), nullptr},
                &sink);
}

void mma_16x8x16(float* d, const float* a, const float* b, bool bf16) {
  if (bf16) {
    launch_kernel(mma_kernel<__nv_bfloat16>, {1, 32, 0, nullptr}, d, a, b);
  } else {
    launch_kernel(mma_kernel<__half>, {1, 32, 0, nullptr}, d, a, b);
  }
}

}  // namespace cuemu_test
