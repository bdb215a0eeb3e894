#include "safetensors_file.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "strata/model/dequantize.h"

namespace strata::model {
namespace {

StatusOr<SafetensorsDtype> parse_dtype(const std::string& s) {
  if (s == "F32") return SafetensorsDtype::kF32;
  if (s == "F16") return SafetensorsDtype::kF16;
  if (s == "BF16") return SafetensorsDtype::kBF16;
  return unimplemented_error("dtype " + s + " is not supported (F32, F16, BF16)");
}

uint64_t dtype_bytes(SafetensorsDtype d) { return d == SafetensorsDtype::kF32 ? 4 : 2; }

}  // namespace

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  STRATA_ASSIGN_OR_RETURN(file->mapping_, MappedFile::open(path));
  if (file->mapping_.size_bytes() < 8) {
    return data_loss_error(path + ": too short to be a safetensors file");
  }
  Status status = file->parse();
  if (!status.ok()) return Status(status.code(), path + ": " + status.message());
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

Status SafetensorsFile::parse() {
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, mapping_.data(), 8);
  if (header_bytes > mapping_.size_bytes() - 8) {
    return data_loss_error("header length " + std::to_string(header_bytes) +
                           " exceeds the file (truncated?)");
  }
  data_offset_bytes_ = 8 + header_bytes;
  const uint64_t data_size = mapping_.size_bytes() - data_offset_bytes_;
  nlohmann::json header = nlohmann::json::parse(mapping_.data() + 8, mapping_.data() + 8 + header_bytes, nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return invalid_argument_error("header is not a JSON object");
  }
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "tensor '" + name + "': ";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      return invalid_argument_error(where + "malformed header entry");
    }
    SafetensorsTensor t;
    StatusOr<SafetensorsDtype> dtype = parse_dtype(entry["dtype"].get<std::string>());
    if (!dtype.ok()) return Status(dtype.status().code(), where + dtype.status().message());
    t.dtype = *dtype;
    // Caps every dimension and the element count at 2^40 so that neither the int64_t shape nor
    // the byte-size product below can overflow.
    constexpr uint64_t kMaxElements = uint64_t{1} << 40;
    uint64_t num_elements = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) return invalid_argument_error(where + "bad shape");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > kMaxElements || (dim != 0 && num_elements > kMaxElements / dim)) {
        return invalid_argument_error(where + "shape has more than 2^40 elements");
      }
      t.shape.push_back(static_cast<int64_t>(dim));
      num_elements *= dim;
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return invalid_argument_error(where + "bad data_offsets");
    }
    t.begin_bytes = offsets[0].get<uint64_t>();
    t.end_bytes = offsets[1].get<uint64_t>();
    if (t.begin_bytes > t.end_bytes || t.end_bytes > data_size) {
      return data_loss_error(where + "data lies beyond the end of the file (truncated?)");
    }
    if (t.end_bytes - t.begin_bytes != num_elements * dtype_bytes(t.dtype)) {
      return invalid_argument_error(where + "byte size does not match shape and dtype");
    }
    tensors_.emplace(name, std::move(t));
  }
  return Status();
}

void SafetensorsFile::read_as_float(const SafetensorsTensor& t, std::span<float> dst) const {
  const uint8_t* src = mapping_.data() + data_offset_bytes_ + t.begin_bytes;
  const size_t n = dst.size();
  switch (t.dtype) {
    case SafetensorsDtype::kF32:
      std::memcpy(dst.data(), src, n * sizeof(float));
      break;
    case SafetensorsDtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = fp16_to_float(h);
      }
      break;
    case SafetensorsDtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_float(h);
      }
      break;
  }
}

}  // namespace strata::model
