// The safetensors header and tensor table, on arbitrary files.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_file.h"
#include "model/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = strata::model::SafetensorsFile::open(strata::fuzz::as_file(data, size));
  if (!file.ok()) return 0;
  // Every tensor open() accepted lies inside the file: reading it must stay in bounds.
  for (const auto& [name, tensor] : (*file)->tensors()) {
    int64_t count = 1;
    for (int64_t d : tensor.shape) count *= d;
    if (count > (1 << 20)) continue;
    std::vector<float> out(static_cast<size_t>(count));
    (*file)->read_as_float(tensor, out);
  }
  return 0;
}
