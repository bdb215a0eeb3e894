// cuemu: runs CUDA C++ kernels on the CPU, one block at a time, each thread of the block a
// cooperative fiber (docs/kernels/emulator.md).
//
// This header replaces the CUDA device environment when a kernel source is compiled with the host
// compiler and -DSTRATA_CUEMU (kernels/common/cuda_compat.cuh includes it). It keeps NVIDIA's own
// headers for types and the fp16/bf16 conversions (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h in
// host mode), then redefines what only exists on a device:
//   - __global__/__device__/__launch_bounds__ vanish; __shared__ variables become statics in the
//     section "cuemu_shared", which the emulator poisons (all bytes 0xFF: NaN as fp32/fp16/bf16,
//     -1 as an integer) at every block start; dynamic shared memory comes from
//     cuemu::dynamic_shared() (STRATA_DYNAMIC_SHARED in cuda_compat.cuh), equally poisoned and
//     followed by an inaccessible page;
//   - threadIdx/blockIdx/blockDim/gridDim read the running fiber's coordinates;
//   - __syncthreads, warp shuffles, votes and __syncwarp are rendezvous points checked against
//     their lane masks; atomics are plain read-modify-writes (fibers never run concurrently);
//   - the CUDA runtime calls kernel sources make (cudaGetLastError, cudaFuncSetAttribute,
//     occupancy, device attributes) are redirected to an emulated device (cuemu::DeviceModel).
// A detected error (a barrier not every thread reaches, a lane missing from a shuffle, a trap, an
// illegal launch) ends the launch with cuemu::KernelFault, thrown from the launch call.
// The section trick needs clang (GCC drops section attributes of template statics), so emulated
// kernel sources are compiled with clang++ (tests/cuemu/CMakeLists.txt); the runtime and the
// tests that call them are ordinary C++.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cuemu {

// A source position, captured at the call site by a defaulted argument (std::source_location
// needs a newer clang than the one that compiles emulated kernels).
struct Where {
  const char* file;
  int line;
  static constexpr Where here(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return {file, line};
  }
};

// Raised by a launch whose kernel broke a CUDA rule the emulator checks (see the file comment).
class KernelFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Order in which the fibers of a block run: ascending thread index, descending, or a seeded random
// pick at every switch (which also lands cp.async groups at random points before their wait).
enum class Schedule { kForward, kReverse, kRandom };

struct ScheduleConfig {
  Schedule schedule = Schedule::kForward;
  uint64_t seed = 0;
};

// Sets the schedule of later launches; returns the previous one.
ScheduleConfig set_schedule(ScheduleConfig config);
const char* schedule_name(Schedule schedule);

// The emulated device: launch limits and the numbers occupancy queries return.
struct DeviceModel {
  const char* name;
  int sm_count;
  size_t max_shared_per_block;        // without cudaFuncAttributeMaxDynamicSharedMemorySize
  size_t max_shared_per_block_optin;  // the most that attribute may grant
  size_t shared_per_sm;
  size_t reserved_shared_per_block;  // the driver's per-block reservation
  int max_threads_per_block;
  int max_threads_per_sm;
  int max_blocks_per_sm;
};
DeviceModel a100();  // sm_80: 108 SMs, 163 KiB opt-in shared memory per block
DeviceModel h100();  // sm_90: 132 SMs, 227 KiB
// Sets the device later launches and queries see (default a100()); returns the previous one.
DeviceModel set_device(const DeviceModel& device);

// Sets `schedule` (and optionally a device) for the lifetime of the object.
class ScopedSchedule {
 public:
  explicit ScopedSchedule(ScheduleConfig config) : previous_(set_schedule(config)) {}
  ~ScopedSchedule() { set_schedule(previous_); }
  ScopedSchedule(const ScopedSchedule&) = delete;
  ScopedSchedule& operator=(const ScopedSchedule&) = delete;

 private:
  ScheduleConfig previous_;
};

namespace detail {

struct ThreadCoords {
  uint3 thread_idx;
  int lane;
};
extern ThreadCoords* current_thread;  // the running fiber
extern uint3 block_idx;
extern dim3 block_dim;
extern dim3 grid_dim;

void run_grid(const void* kernel, const std::function<void()>& body, dim3 grid, dim3 block,
              size_t dynamic_shared, const char* file, int line);

enum class WarpOp {
  kShflIdx,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kSyncWarp,
  kMma,
  kLdmatrix
};

// A warp collective: the caller's lane deposits `in` and receives the lanes' combined result.
// For shuffles `arg` is the lane/delta/mask operand; payload words are 32-bit.
struct WarpRequest {
  WarpOp op;
  unsigned mask;
  int arg;
  int width;
  const uint32_t* in;
  int in_words;
  uint32_t* out;
  int out_words;
};
void warp_collective(const WarpRequest& request, Where where);

void syncthreads(int predicate, int* count, Where where);
// The model of mma.sync / ldmatrix (tensor_core.cpp): `in` holds each lane's operand words,
// `out` receives each lane's result words.
void tensor_core_model(const WarpRequest& request, const uint32_t (*in)[16], uint32_t (*out)[16]);
[[noreturn]] void trap(Where where);
// Ends the block with `message` (which names `where` and the calling thread).
[[noreturn]] void fault(const std::string& what, Where where);
// Faults unless [p, p + n) lies in the block's shared memory.
void require_shared(const void* p, size_t n, const char* what, Where where);
void* dynamic_shared_base();

}  // namespace detail

// Launches `kernel` over grid x block: what kernel<<<grid, block, dynamic_shared, stream>>>(args)
// does on a GPU, run to completion before returning (streams are ignored). file:line name the
// launch site in errors.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t dynamic_shared,
            cudaStream_t /*stream*/, const char* file, int line, Args&&... args) {
  std::tuple<std::decay_t<Params>...> values(std::forward<Args>(args)...);
  detail::run_grid(
      reinterpret_cast<const void*>(kernel), [&] { std::apply(kernel, values); }, grid, block,
      dynamic_shared, file, line);
}

// The block's dynamic shared memory.
template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(detail::dynamic_shared_base());
}

// cp.async: copies cp_size bytes (4, 8 or 16) from global `src` to shared `dst`, zero-filling past
// src_size bytes; the copy lands once its group is waited for (or earlier, at a random point,
// under the random schedule). Both addresses must be cp_size aligned.
void cp_async(void* dst, const void* src, int cp_size, int src_size,
              ::cuemu::Where where = ::cuemu::Where::here());
void cp_async_commit();
void cp_async_wait(int pending_groups, ::cuemu::Where where = ::cuemu::Where::here());

// Tensor-core instructions (kernels/common/ptx.cuh documents the fragment layouts): warp
// collectives of all 32 lanes.
void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row, bool trans,
                 ::cuemu::Where where = ::cuemu::Where::here());
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                  const float (&c)[4], bool bf16, ::cuemu::Where where = ::cuemu::Where::here());

// Runtime API of the emulated device (the kernel sources' cudaX calls are redirected here).
cudaError_t GetLastError();
cudaError_t PeekAtLastError();
const char* GetErrorString(cudaError_t error);
cudaError_t GetDevice(int* device);
cudaError_t DeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t FuncSetAttributeImpl(const void* kernel, cudaFuncAttribute attr, int value);
cudaError_t OccupancyImpl(int* blocks, const void* kernel, int block_size, size_t shared);
template <typename F>
cudaError_t FuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  return FuncSetAttributeImpl(reinterpret_cast<const void*>(kernel), attr, value);
}
template <typename F>
cudaError_t OccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, F* kernel, int block_size,
                                                      size_t shared) {
  return OccupancyImpl(blocks, reinterpret_cast<const void*>(kernel), block_size, shared);
}

}  // namespace cuemu

// ---- the device environment -------------------------------------------------------------------

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#undef __constant__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static __attribute__((section("cuemu_shared")))
#define __constant__ static

#define threadIdx (::cuemu::detail::current_thread->thread_idx)
#define blockIdx (::cuemu::detail::block_idx)
#define blockDim (::cuemu::detail::block_dim)
#define gridDim (::cuemu::detail::grid_dim)
#undef warpSize
#define warpSize 32

#define cudaGetLastError ::cuemu::GetLastError
#define cudaPeekAtLastError ::cuemu::PeekAtLastError
#define cudaGetErrorString ::cuemu::GetErrorString
#define cudaGetDevice ::cuemu::GetDevice
#define cudaDeviceGetAttribute ::cuemu::DeviceGetAttribute
#define cudaFuncSetAttribute ::cuemu::FuncSetAttribute
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor \
  ::cuemu::OccupancyMaxActiveBlocksPerMultiprocessor

inline void __syncthreads(::cuemu::Where where = ::cuemu::Where::here()) {
  ::cuemu::detail::syncthreads(1, nullptr, where);
}
inline int __syncthreads_count(int predicate, ::cuemu::Where where = ::cuemu::Where::here()) {
  int count = 0;
  ::cuemu::detail::syncthreads(predicate, &count, where);
  return count;
}
inline int __syncthreads_or(int predicate, ::cuemu::Where where = ::cuemu::Where::here()) {
  return __syncthreads_count(predicate, where) > 0;
}
inline int __syncthreads_and(int predicate, ::cuemu::Where where = ::cuemu::Where::here()) {
  int count = 0;
  ::cuemu::detail::syncthreads(predicate, &count, where);
  return count == static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
}
[[noreturn]] inline void __trap(::cuemu::Where where = ::cuemu::Where::here()) {
  ::cuemu::detail::trap(where);
}
inline void __threadfence_block() {}
inline void __threadfence() {}
inline void __threadfence_system() {}

namespace cuemu::detail {

template <typename T>
T shuffle(WarpOp op, unsigned mask, T value, int arg, int width, Where where) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8 && sizeof(T) % 2 == 0,
                "shuffled values are 2, 4 or 8 bytes");
  constexpr int kWords = (sizeof(T) + 3) / 4;
  uint32_t in[kWords] = {};
  uint32_t out[kWords] = {};
  std::memcpy(in, &value, sizeof(T));
  warp_collective({op, mask, arg, width, in, kWords, out, kWords}, where);
  T result;
  std::memcpy(&result, out, sizeof(T));
  return result;
}

inline unsigned vote(WarpOp op, unsigned mask, int predicate, Where where) {
  const uint32_t in = predicate != 0;
  uint32_t out = 0;
  warp_collective({op, mask, 0, 32, &in, 1, &out, 1}, where);
  return out;
}

}  // namespace cuemu::detail

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32,
              ::cuemu::Where where = ::cuemu::Where::here()) {
  return ::cuemu::detail::shuffle(::cuemu::detail::WarpOp::kShflIdx, mask, value, src_lane, width,
                                  where);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32,
                 ::cuemu::Where where = ::cuemu::Where::here()) {
  return ::cuemu::detail::shuffle(::cuemu::detail::WarpOp::kShflUp, mask, value,
                                  static_cast<int>(delta), width, where);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32,
                   ::cuemu::Where where = ::cuemu::Where::here()) {
  return ::cuemu::detail::shuffle(::cuemu::detail::WarpOp::kShflDown, mask, value,
                                  static_cast<int>(delta), width, where);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32,
                  ::cuemu::Where where = ::cuemu::Where::here()) {
  return ::cuemu::detail::shuffle(::cuemu::detail::WarpOp::kShflXor, mask, value, lane_mask, width,
                                  where);
}
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              ::cuemu::Where where = ::cuemu::Where::here()) {
  return ::cuemu::detail::vote(::cuemu::detail::WarpOp::kBallot, mask, predicate, where);
}
inline int __any_sync(unsigned mask, int predicate, ::cuemu::Where where = ::cuemu::Where::here()) {
  return static_cast<int>(
      ::cuemu::detail::vote(::cuemu::detail::WarpOp::kAny, mask, predicate, where));
}
inline int __all_sync(unsigned mask, int predicate, ::cuemu::Where where = ::cuemu::Where::here()) {
  return static_cast<int>(
      ::cuemu::detail::vote(::cuemu::detail::WarpOp::kAll, mask, predicate, where));
}
inline void __syncwarp(unsigned mask = 0xffffffffu, ::cuemu::Where where = ::cuemu::Where::here()) {
  ::cuemu::detail::vote(::cuemu::detail::WarpOp::kSyncWarp, mask, 1, where);
}

// Atomics: fibers of the emulator never run at the same time, so a read-modify-write is atomic.
namespace cuemu::detail {
template <typename T, typename Op>
T read_modify_write(T* address, Op op) {
  const T old = *address;
  *address = op(old);
  return old;
}
}  // namespace cuemu::detail

template <typename T>
T atomicAdd(T* a, T v) {
  return ::cuemu::detail::read_modify_write(a, [v](T o) { return o + v; });
}
template <typename T>
T atomicSub(T* a, T v) {
  return ::cuemu::detail::read_modify_write(a, [v](T o) { return o - v; });
}
template <typename T>
T atomicMax(T* a, T v) {
  return ::cuemu::detail::read_modify_write(a, [v](T o) { return o < v ? v : o; });
}
template <typename T>
T atomicMin(T* a, T v) {
  return ::cuemu::detail::read_modify_write(a, [v](T o) { return v < o ? v : o; });
}
template <typename T>
T atomicExch(T* a, T v) {
  return ::cuemu::detail::read_modify_write(a, [v](T) { return v; });
}
template <typename T>
T atomicCAS(T* a, T compare, T v) {
  return ::cuemu::detail::read_modify_write(a, [=](T o) { return o == compare ? v : o; });
}
template <typename T>
T atomicAnd(T* a, T v) {
  return ::cuemu::detail::read_modify_write(a, [v](T o) { return o & v; });
}
template <typename T>
T atomicOr(T* a, T v) {
  return ::cuemu::detail::read_modify_write(a, [v](T o) { return o | v; });
}

// Device math that has no host declaration.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
// IEEE multiply and add, each rounded once: never contracted into an FMA (clang contracts only
// within one source expression, and these are calls).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, sizeof(i));
  return i;
}
inline float __int_as_float(int i) {
  float x;
  std::memcpy(&x, &i, sizeof(x));
  return x;
}
inline unsigned __float_as_uint(float x) { return static_cast<unsigned>(__float_as_int(x)); }
inline float __uint_as_float(unsigned i) { return __int_as_float(static_cast<int>(i)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
template <typename T>
T __ldg(const T* address) {
  return *address;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a < b ? b : a; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
