// Read-only view of a GGUF (v2/v3) model file: metadata key/values, tensor infos and tensor bytes.
//
// The file is memory-mapped; tensor data pointers stay valid while the GgufFile lives. Every
// structural problem (bad magic, unsupported version, truncation, out-of-range offsets, unknown
// tensor type, misalignment) is reported by open() as a Status naming the file and, where there
// is one, the key or tensor. Thread-safe for concurrent reads after open().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "strata/common/status.h"
#include "strata/model/ggml_types.h"
#include "strata/model/mapped_file.h"

namespace strata::model {

// A metadata value. Integers of every width are widened to int64_t (uint64 values above INT64_MAX
// are rejected at open), floats to double. Arrays are homogeneous.
using GgufValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<bool>, std::vector<std::string>>;

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // innermost (contiguous) first, as in the file
  GgmlType type;
  uint64_t offset_bytes;      // from the start of the tensor data section
  uint64_t size_bytes;
  int64_t num_elements;
};

class GgufFile {
 public:
  // Opens and validates `path`. Fails with INVALID_ARGUMENT / DATA_LOSS / UNIMPLEMENTED naming
  // the file and the offending key or tensor; NOT_FOUND if the file cannot be opened.
  static StatusOr<std::unique_ptr<GgufFile>> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  // The whole file as mapped.
  std::span<const uint8_t> bytes() const { return {mapping_.data(), mapping_.size_bytes()}; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  bool has_key(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }
  // Typed lookups: NOT_FOUND if absent, INVALID_ARGUMENT if the stored type differs (any integer
  // width is accepted by get_int, any float or integer by get_float).
  StatusOr<std::string> get_string(std::string_view key) const;
  StatusOr<int64_t> get_int(std::string_view key) const;
  StatusOr<double> get_float(std::string_view key) const;
  StatusOr<bool> get_bool(std::string_view key) const;
  StatusOr<const std::vector<std::string>*> get_string_array(std::string_view key) const;
  StatusOr<const std::vector<int64_t>*> get_int_array(std::string_view key) const;
  StatusOr<const std::vector<double>*> get_float_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr if there is no tensor of that name.
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // Start of the tensor's bytes inside the mapping (size_bytes long, aligned to alignment()).
  const uint8_t* tensor_data(const GgufTensorInfo& info) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  MappedFile mapping_;  // the whole file, read-only
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_bytes_ = 0;  // start of the tensor data section within the file
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;  // name -> index into tensors_
};

}  // namespace strata::model
