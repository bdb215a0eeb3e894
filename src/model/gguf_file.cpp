#include "strata/model/gguf_file.h"

#include "strata/model/mapped_file.h"

#include <cstring>
#include <limits>

namespace strata::model {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian uint32
constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS

// On-disk value type ids (gguf.h `enum gguf_type`).
enum class ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Bounds-checked little-endian cursor over the mapped file. Every read either succeeds or leaves
// a DATA_LOSS status describing where the file ended.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t position() const { return pos_; }
  bool failed() const { return !status_.ok(); }
  const Status& status() const { return status_; }

  template <typename T>
  T read() {
    T value{};
    if (!require(sizeof(T))) return value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string() {
    const uint64_t length = read<uint64_t>();
    if (failed() || !require(length)) return {};
    std::string s(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return s;
  }

  void fail(Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

 private:
  bool require(uint64_t num_bytes) {
    if (failed()) return false;
    if (num_bytes > size_ - pos_) {
      fail(data_loss_error("file is truncated: needs " + std::to_string(num_bytes) +
                           " bytes at offset " + std::to_string(pos_) + " but has " +
                           std::to_string(size_ - pos_)));
      return false;
    }
    return true;
  }

  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  Status status_;
};

bool is_integer_type(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kU16: case ValueType::kI16:
    case ValueType::kU32: case ValueType::kI32: case ValueType::kU64: case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

// Reads one scalar integer of type t widened to int64_t; fails on uint64 values above INT64_MAX.
int64_t read_integer(Cursor& c, ValueType t) {
  switch (t) {
    case ValueType::kU8: return c.read<uint8_t>();
    case ValueType::kI8: return c.read<int8_t>();
    case ValueType::kU16: return c.read<uint16_t>();
    case ValueType::kI16: return c.read<int16_t>();
    case ValueType::kU32: return c.read<uint32_t>();
    case ValueType::kI32: return c.read<int32_t>();
    case ValueType::kI64: return c.read<int64_t>();
    case ValueType::kU64: {
      const uint64_t v = c.read<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        c.fail(invalid_argument_error("uint64 value " + std::to_string(v) + " is out of range"));
      }
      return static_cast<int64_t>(v);
    }
    default: return 0;
  }
}

double read_float(Cursor& c, ValueType t) {
  return t == ValueType::kF32 ? c.read<float>() : c.read<double>();
}

bool read_bool(Cursor& c) {
  const uint8_t b = c.read<uint8_t>();
  if (b > 1) c.fail(invalid_argument_error("bool value " + std::to_string(b) + " is not 0 or 1"));
  return b == 1;
}

// Size in bytes of one element of a fixed-size value type; 0 for string/array/unknown.
uint64_t fixed_value_size(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    default: return 0;
  }
}

GgufValue read_array(Cursor& c, uint64_t remaining_bytes) {
  const auto elem_type = static_cast<ValueType>(c.read<uint32_t>());
  const uint64_t count = c.read<uint64_t>();
  if (c.failed()) return int64_t{0};
  // Reject counts the rest of the file cannot hold before reserving memory for them.
  const uint64_t min_elem_bytes = elem_type == ValueType::kString ? 8 : fixed_value_size(elem_type);
  if (min_elem_bytes == 0) {
    c.fail(invalid_argument_error("array of unsupported element type " +
                                  std::to_string(static_cast<uint32_t>(elem_type))));
    return int64_t{0};
  }
  if (count > remaining_bytes / min_elem_bytes) {
    c.fail(data_loss_error("array of " + std::to_string(count) + " elements exceeds the file"));
    return int64_t{0};
  }
  if (elem_type == ValueType::kString) {
    std::vector<std::string> v;
    v.reserve(count);
    for (uint64_t i = 0; i < count && !c.failed(); ++i) v.push_back(c.read_string());
    return v;
  }
  if (elem_type == ValueType::kBool) {
    std::vector<bool> v(count);
    for (uint64_t i = 0; i < count && !c.failed(); ++i) v[i] = read_bool(c);
    return v;
  }
  if (elem_type == ValueType::kF32 || elem_type == ValueType::kF64) {
    std::vector<double> v(count);
    for (uint64_t i = 0; i < count && !c.failed(); ++i) v[i] = read_float(c, elem_type);
    return v;
  }
  std::vector<int64_t> v(count);
  for (uint64_t i = 0; i < count && !c.failed(); ++i) v[i] = read_integer(c, elem_type);
  return v;
}

GgufValue read_value(Cursor& c, ValueType t, uint64_t file_size) {
  if (is_integer_type(t)) return read_integer(c, t);
  switch (t) {
    case ValueType::kF32: case ValueType::kF64: return read_float(c, t);
    case ValueType::kBool: return read_bool(c);
    case ValueType::kString: return c.read_string();
    case ValueType::kArray: return read_array(c, file_size - c.position());
    default:
      c.fail(invalid_argument_error("unknown value type " +
                                    std::to_string(static_cast<uint32_t>(t))));
      return int64_t{0};
  }
}

template <typename T>
StatusOr<const T*> get_typed(const std::map<std::string, GgufValue, std::less<>>& metadata,
                             std::string_view key, const std::string& path,
                             const char* type_name) {
  auto it = metadata.find(key);
  if (it == metadata.end()) {
    return not_found_error(path + ": metadata key '" + std::string(key) + "' is missing");
  }
  const T* v = std::get_if<T>(&it->second);
  if (v == nullptr) {
    return invalid_argument_error(path + ": metadata key '" + std::string(key) +
                                  "' is not of type " + type_name);
  }
  return v;
}

}  // namespace

StatusOr<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  STRATA_ASSIGN_OR_RETURN(file->mapping_, MappedFile::open(path));
  Status status = file->parse();
  if (!status.ok()) return Status(status.code(), path + ": " + status.message());
  return file;
}

GgufFile::~GgufFile() = default;

Status GgufFile::parse() {
  Cursor c(mapping_.data(), mapping_.size_bytes());
  const uint32_t magic = c.read<uint32_t>();
  if (c.failed()) return data_loss_error("not a GGUF file: shorter than its header");
  if (magic != kGgufMagic) return invalid_argument_error("not a GGUF file: bad magic");
  version_ = c.read<uint32_t>();
  if (c.failed()) return c.status();
  if (version_ != 2 && version_ != 3) {
    return unimplemented_error("unsupported GGUF version " + std::to_string(version_) +
                               " (supported: 2, 3)");
  }
  const uint64_t num_tensors = c.read<uint64_t>();
  const uint64_t num_kv = c.read<uint64_t>();
  if (c.failed()) return c.status();
  // Each kv needs at least 12 bytes (key length + type), each tensor info at least 24.
  if (num_kv > mapping_.size_bytes() / 12 || num_tensors > mapping_.size_bytes() / 24) {
    return data_loss_error("header counts (" + std::to_string(num_kv) + " keys, " +
                           std::to_string(num_tensors) + " tensors) exceed the file size");
  }

  for (uint64_t i = 0; i < num_kv; ++i) {
    std::string key = c.read_string();
    const auto type = static_cast<ValueType>(c.read<uint32_t>());
    if (c.failed()) return c.status();
    GgufValue value = read_value(c, type, mapping_.size_bytes());
    if (c.failed()) {
      return Status(c.status().code(), "metadata key '" + key + "': " + c.status().message());
    }
    if (!metadata_.emplace(key, std::move(value)).second) {
      return invalid_argument_error("duplicate metadata key '" + key + "'");
    }
  }

  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) {
    const int64_t* a = std::get_if<int64_t>(&it->second);
    if (a == nullptr || *a <= 0 || (*a & (*a - 1)) != 0) {
      return invalid_argument_error("general.alignment must be a positive power of two");
    }
    alignment_ = static_cast<uint64_t>(*a);
  }

  tensors_.reserve(num_tensors);
  for (uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensorInfo info;
    info.name = c.read_string();
    const uint32_t num_dims = c.read<uint32_t>();
    if (c.failed()) return c.status();
    if (num_dims == 0 || num_dims > kMaxDims) {
      return invalid_argument_error("tensor '" + info.name + "': " + std::to_string(num_dims) +
                                    " dimensions (must be 1.." + std::to_string(kMaxDims) + ")");
    }
    info.num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      const int64_t dim = c.read<int64_t>();
      if (c.failed()) return c.status();
      if (dim <= 0 || dim > (int64_t{1} << 40) / info.num_elements) {
        return invalid_argument_error("tensor '" + info.name + "': invalid dimension " +
                                      std::to_string(dim));
      }
      info.dims.push_back(dim);
      info.num_elements *= dim;
    }
    const uint32_t type_id = c.read<uint32_t>();
    info.offset_bytes = c.read<uint64_t>();
    if (c.failed()) return c.status();
    const std::optional<GgmlTypeInfo> type_info = ggml_type_info(type_id);
    if (!type_info) {
      return unimplemented_error("tensor '" + info.name + "': unknown ggml type id " +
                                 std::to_string(type_id));
    }
    info.type = static_cast<GgmlType>(type_id);
    if (info.dims[0] % type_info->block_elements != 0) {
      return invalid_argument_error("tensor '" + info.name + "': row length " +
                                    std::to_string(info.dims[0]) + " is not a multiple of the " +
                                    std::string(type_info->name) + " block size " +
                                    std::to_string(type_info->block_elements));
    }
    info.size_bytes = static_cast<uint64_t>(info.num_elements / type_info->block_elements) *
                      static_cast<uint64_t>(type_info->block_bytes);
    if (info.offset_bytes % alignment_ != 0) {
      return invalid_argument_error("tensor '" + info.name + "': data offset " +
                                    std::to_string(info.offset_bytes) + " is not aligned to " +
                                    std::to_string(alignment_));
    }
    if (!tensor_index_.emplace(info.name, tensors_.size()).second) {
      return invalid_argument_error("duplicate tensor '" + info.name + "'");
    }
    tensors_.push_back(std::move(info));
  }

  data_offset_bytes_ = (c.position() + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_bytes_ > mapping_.size_bytes() && num_tensors > 0) {
    return data_loss_error("file is truncated before its tensor data section");
  }
  const uint64_t data_size = mapping_.size_bytes() - std::min(data_offset_bytes_, mapping_.size_bytes());
  for (const GgufTensorInfo& info : tensors_) {
    if (info.offset_bytes > data_size || info.size_bytes > data_size - info.offset_bytes) {
      return data_loss_error("tensor '" + info.name + "': data [" +
                             std::to_string(info.offset_bytes) + ", +" +
                             std::to_string(info.size_bytes) +
                             ") lies beyond the end of the file (truncated?)");
    }
  }
  return Status();
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& info) const {
  return mapping_.data() + data_offset_bytes_ + info.offset_bytes;
}

StatusOr<std::string> GgufFile::get_string(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const std::string* v,
                          get_typed<std::string>(metadata_, key, path_, "string"));
  return *v;
}

StatusOr<int64_t> GgufFile::get_int(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const int64_t* v, get_typed<int64_t>(metadata_, key, path_, "integer"));
  return *v;
}

StatusOr<double> GgufFile::get_float(std::string_view key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  }
  STRATA_ASSIGN_OR_RETURN(const double* v, get_typed<double>(metadata_, key, path_, "float"));
  return *v;
}

StatusOr<bool> GgufFile::get_bool(std::string_view key) const {
  STRATA_ASSIGN_OR_RETURN(const bool* v, get_typed<bool>(metadata_, key, path_, "bool"));
  return *v;
}

StatusOr<const std::vector<std::string>*> GgufFile::get_string_array(std::string_view key) const {
  return get_typed<std::vector<std::string>>(metadata_, key, path_, "string array");
}

StatusOr<const std::vector<int64_t>*> GgufFile::get_int_array(std::string_view key) const {
  return get_typed<std::vector<int64_t>>(metadata_, key, path_, "integer array");
}

StatusOr<const std::vector<double>*> GgufFile::get_float_array(std::string_view key) const {
  return get_typed<std::vector<double>>(metadata_, key, path_, "float array");
}

}  // namespace strata::model
