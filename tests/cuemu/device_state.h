// State of the emulated device shared by the scheduler (runtime.cpp) and the runtime API
// (device.cpp). Internal to tests/cuemu.
#pragma once

#include <unordered_map>

#include "cuemu/cuemu.h"

namespace cuemu::detail {

struct DeviceState {
  DeviceModel model = a100();
  cudaError_t last_error = cudaSuccess;
  std::unordered_map<const void*, int> max_dynamic_shared;  // per kernel, from FuncSetAttribute
};
DeviceState& device_state();

}  // namespace cuemu::detail
