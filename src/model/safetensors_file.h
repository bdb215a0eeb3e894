// Read-only, memory-mapped view of one .safetensors file (private to the model module).
// Layout: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/common/status.h"
#include "strata/model/mapped_file.h"

namespace strata::model {

enum class SafetensorsDtype { kF32, kF16, kBF16 };

struct SafetensorsTensor {
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;  // outermost first
  uint64_t begin_bytes;        // offsets within the data section
  uint64_t end_bytes;
};

class SafetensorsFile {
 public:
  // DATA_LOSS for truncated files or offsets outside the data, UNIMPLEMENTED for other dtypes;
  // messages name the file and tensor.
  static StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // The whole file as mapped.
  std::span<const uint8_t> bytes() const { return {mapping_.data(), mapping_.size_bytes()}; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  // Converts the tensor to float32. REQUIRES dst.size() == number of elements.
  void read_as_float(const SafetensorsTensor& tensor, std::span<float> dst) const;

 private:
  SafetensorsFile() = default;
  Status parse();

  std::string path_;
  MappedFile mapping_;  // the whole file, read-only
  uint64_t data_offset_bytes_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
};

}  // namespace strata::model
