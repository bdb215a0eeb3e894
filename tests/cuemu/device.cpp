// The emulated device (cuemu.h): its model, the last error, per-kernel shared memory limits, and
// the CUDA runtime calls kernel sources make, redirected here by cuemu.h.

#include <algorithm>
#include <utility>

#include "cuemu/cuemu.h"
#include "cuemu/device_state.h"

namespace cuemu {

namespace detail {

DeviceState& device_state() {
  static DeviceState state;
  return state;
}

}  // namespace detail

DeviceModel a100() {
  return {"A100 (sm_80)", 108, 48 * 1024, 163 * 1024, 164 * 1024, 1024, 1024, 2048, 32};
}
DeviceModel h100() {
  return {"H100 (sm_90)", 132, 48 * 1024, 227 * 1024, 228 * 1024, 1024, 1024, 2048, 32};
}

DeviceModel set_device(const DeviceModel& device) {
  return std::exchange(detail::device_state().model, device);
}

cudaError_t GetLastError() { return std::exchange(detail::device_state().last_error, cudaSuccess); }
cudaError_t PeekAtLastError() { return detail::device_state().last_error; }

const char* GetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error (emulated device)";
    case cudaErrorInvalidConfiguration:
      return "invalid launch configuration (emulated device)";
    case cudaErrorLaunchFailure:
      return "kernel fault (emulated device)";
    case cudaErrorInvalidValue:
      return "invalid value (emulated device)";
    default:
      return "error (emulated device)";
  }
}

cudaError_t GetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t DeviceGetAttribute(int* value, cudaDeviceAttr attr, int /*device*/) {
  const DeviceModel& d = detail::device_state().model;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = d.sm_count;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = d.max_threads_per_block;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(d.max_shared_per_block_optin);
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(d.max_shared_per_block);
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    default:
      return detail::device_state().last_error = cudaErrorInvalidValue;
  }
}

cudaError_t FuncSetAttributeImpl(const void* kernel, cudaFuncAttribute attr, int value) {
  auto& e = detail::device_state();
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > e.model.max_shared_per_block_optin) {
    return e.last_error = cudaErrorInvalidValue;
  }
  e.max_dynamic_shared[kernel] = value;
  return cudaSuccess;
}

cudaError_t OccupancyImpl(int* blocks, const void* /*kernel*/, int block_size, size_t shared) {
  const DeviceModel& d = detail::device_state().model;
  if (block_size <= 0 || block_size > d.max_threads_per_block) {
    return detail::device_state().last_error = cudaErrorInvalidValue;
  }
  const int warps = (block_size + 31) / 32;
  int n = std::min(d.max_blocks_per_sm, d.max_threads_per_sm / (warps * 32));
  n = std::min<int>(n, static_cast<int>(d.shared_per_sm / (shared + d.reserved_shared_per_block)));
  *blocks = n;  // registers are not modelled (ptxas budgets bound them, docs/kernels)
  return cudaSuccess;
}

}  // namespace cuemu
