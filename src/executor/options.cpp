// The spellings of executor options (dtype, device) that configs and command lines use.

#include <algorithm>
#include <string>

#include "strata/executor/executor.h"

namespace strata::executor {

StatusOr<DType> parse_dtype(const std::string& name) {
  const std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype || dtype_is_quantized(*dtype)) {
    return invalid_argument_error("unknown compute dtype '" + name + "' (float32, bfloat16, float16)");
  }
  return *dtype;
}

StatusOr<Device> parse_device(const std::string& name) {
  if (name == "cpu") return Device{DeviceKind::kCpu, 0};
  if (name == "auto") return Device{DeviceKind::kAuto, 0};
  if (name == "cuda") return Device{DeviceKind::kCuda, 0};
  if (name.starts_with("cuda:")) {
    const std::string index = name.substr(5);
    if (!index.empty() && std::all_of(index.begin(), index.end(), ::isdigit) && index.size() < 4) {
      return Device{DeviceKind::kCuda, std::stoi(index)};
    }
  }
  return invalid_argument_error("unknown device '" + name + "' (cpu, cuda, cuda:N, auto)");
}

std::string device_name(const Device& device) {
  switch (device.kind) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      break;
  }
  return "cuda:" + std::to_string(device.index);
}

}  // namespace strata::executor
