// A whole file mapped read-only into memory. Move-only; unmaps on
// destruction. The bytes stay valid as long as the MappedFile lives.
#pragma once

#include <cstdint>
#include <string>

#include "strata/common/status.h"

namespace strata::model {

class MappedFile {
 public:
  // NOT_FOUND if the file cannot be opened, INTERNAL if it cannot be mapped; messages name it.
  static StatusOr<MappedFile> open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  uint64_t size_bytes() const { return size_bytes_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_bytes_ = 0;
};

}  // namespace strata::model
