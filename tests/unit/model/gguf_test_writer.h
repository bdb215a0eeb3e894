// Test helpers for the model loaders: a GGUF writer that builds files byte by byte, synthetic
// weight values, a temporary directory, and a Status matcher.
//
// GgufWriter output layout (GGUF v2/v3, all little-endian):
//   u32 magic "GGUF", u32 version, u64 num_tensors, u64 num_kv
//   num_kv x   {u64 key_len, key bytes, u32 value_type, value}
//   num_tensors x {u64 name_len, name bytes, u32 num_dims, u64 dims[num_dims] (innermost first),
//                  u32 ggml_type, u64 offset (from the start of the data section)}
//   zero padding up to a multiple of the alignment, then the data section.
// Every count, type id and offset can be set to a malformed value; nothing is validated here.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"
#include "support/temp_dir.h"

namespace strata::model::test_util {

using strata::test_util::TempDir;

// On-disk metadata value type ids (gguf.h `enum gguf_type`).
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" as a little-endian u32

// Ggml type ids used by the tests (ggml.h `enum ggml_type`).
constexpr uint32_t kTypeF32 = 0;
constexpr uint32_t kTypeQ4_1 = 3;
constexpr uint32_t kTypeQ8_0 = 8;
constexpr uint32_t kTypeQ4_K = 12;

// Append-only little-endian byte buffer.
class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    append(&value, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    append(s.data(), s.size());
  }
  void append(const void* data, size_t num_bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + num_bytes);
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  // Header fields; the counts default to the number of kvs / tensor infos added.
  void set_magic(uint32_t magic) { magic_ = magic; }
  void set_version(uint32_t version) { version_ = version; }
  void set_num_tensors(uint64_t n) { num_tensors_override_ = n; }
  void set_num_kv(uint64_t n) { num_kv_override_ = n; }
  // Alignment of the data section and of add_tensor() offsets. Does not write general.alignment
  // (add that key yourself). REQUIRES: called before add_tensor().
  void set_alignment(uint64_t alignment) { alignment_ = alignment; }

  // --- metadata: one call per on-disk value type ---
  void add_u8(std::string_view key, uint8_t v) { scalar(key, GgufValueType::kU8, v); }
  void add_i8(std::string_view key, int8_t v) { scalar(key, GgufValueType::kI8, v); }
  void add_u16(std::string_view key, uint16_t v) { scalar(key, GgufValueType::kU16, v); }
  void add_i16(std::string_view key, int16_t v) { scalar(key, GgufValueType::kI16, v); }
  void add_u32(std::string_view key, uint32_t v) { scalar(key, GgufValueType::kU32, v); }
  void add_i32(std::string_view key, int32_t v) { scalar(key, GgufValueType::kI32, v); }
  void add_u64(std::string_view key, uint64_t v) { scalar(key, GgufValueType::kU64, v); }
  void add_i64(std::string_view key, int64_t v) { scalar(key, GgufValueType::kI64, v); }
  void add_f32(std::string_view key, float v) { scalar(key, GgufValueType::kF32, v); }
  void add_f64(std::string_view key, double v) { scalar(key, GgufValueType::kF64, v); }
  void add_bool(std::string_view key, bool v) {
    scalar(key, GgufValueType::kBool, static_cast<uint8_t>(v ? 1 : 0));
  }
  void add_string(std::string_view key, std::string_view v) {
    begin_kv(key, GgufValueType::kString);
    kv_.put_string(v);
  }
  // Array of a fixed-size element type; T must match elem_type's on-disk width.
  template <typename T>
  void add_array(std::string_view key, GgufValueType elem_type, const std::vector<T>& values) {
    begin_array(key, elem_type, values.size());
    for (const T& v : values) kv_.put(v);
  }
  void add_bool_array(std::string_view key, const std::vector<bool>& values) {
    begin_array(key, GgufValueType::kBool, values.size());
    for (bool v : values) kv_.put<uint8_t>(v ? 1 : 0);
  }
  void add_string_array(std::string_view key, const std::vector<std::string>& values) {
    begin_array(key, GgufValueType::kString, values.size());
    for (const std::string& v : values) kv_.put_string(v);
  }
  // Key and type id followed by arbitrary payload bytes (for malformed values).
  void add_raw_kv(std::string_view key, uint32_t type_id, const std::vector<uint8_t>& payload) {
    kv_.put_string(key);
    kv_.put<uint32_t>(type_id);
    kv_.append(payload.data(), payload.size());
    ++num_kv_;
  }

  // --- tensors ---
  // Tensor info plus `data`, placed at the next offset of the data section that is a multiple of
  // the alignment. dims are innermost first. Returns the offset.
  uint64_t add_tensor(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type_id,
                      const std::vector<uint8_t>& data) {
    const uint64_t offset = round_up(data_.size(), alignment_);
    data_.resize(offset, 0);
    data_.insert(data_.end(), data.begin(), data.end());
    add_tensor_info(name, dims, type_id, offset);
    return offset;
  }
  // Tensor info only, with any offset; writes no data.
  void add_tensor_info(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type_id,
                       uint64_t offset) {
    infos_.put_string(name);
    infos_.put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) infos_.put<uint64_t>(d);
    infos_.put<uint32_t>(type_id);
    infos_.put<uint64_t>(offset);
    ++num_tensors_;
  }
  // Raw bytes appended to the data section (e.g. to pad the file).
  void append_data(const std::vector<uint8_t>& bytes) {
    data_.insert(data_.end(), bytes.begin(), bytes.end());
  }

  // Bytes before the padding that precedes the data section.
  uint64_t header_size_bytes() const { return 24 + kv_.size() + infos_.size(); }
  // File offset of the data section.
  uint64_t data_section_offset() const { return round_up(header_size_bytes(), alignment_); }

  std::vector<uint8_t> bytes() const {
    ByteWriter out;
    out.put<uint32_t>(magic_);
    out.put<uint32_t>(version_);
    out.put<uint64_t>(num_tensors_override_.value_or(num_tensors_));
    out.put<uint64_t>(num_kv_override_.value_or(num_kv_));
    out.append(kv_.bytes().data(), kv_.size());
    out.append(infos_.bytes().data(), infos_.size());
    std::vector<uint8_t> file = out.bytes();
    if (num_tensors_ > 0 || !data_.empty()) {
      file.resize(data_section_offset(), 0);
      file.insert(file.end(), data_.begin(), data_.end());
    }
    return file;
  }

 private:
  static uint64_t round_up(uint64_t n, uint64_t alignment) {
    return (n + alignment - 1) / alignment * alignment;
  }
  void begin_kv(std::string_view key, GgufValueType type) {
    kv_.put_string(key);
    kv_.put<uint32_t>(static_cast<uint32_t>(type));
    ++num_kv_;
  }
  void begin_array(std::string_view key, GgufValueType elem_type, uint64_t count) {
    begin_kv(key, GgufValueType::kArray);
    kv_.put<uint32_t>(static_cast<uint32_t>(elem_type));
    kv_.put<uint64_t>(count);
  }
  template <typename T>
  void scalar(std::string_view key, GgufValueType type, T v) {
    begin_kv(key, type);
    kv_.put(v);
  }

  uint32_t magic_ = kGgufMagic;
  uint32_t version_;
  uint64_t alignment_ = 32;
  std::optional<uint64_t> num_tensors_override_;
  std::optional<uint64_t> num_kv_override_;
  ByteWriter kv_;
  uint64_t num_kv_ = 0;
  ByteWriter infos_;
  uint64_t num_tensors_ = 0;
  std::vector<uint8_t> data_;
};

// Little-endian bytes of a float array (tensor data for F32 tensors).
inline int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Deterministic, exactly representable values that differ between tensors and elements.
inline float synthetic_value(const std::string& name, int64_t index) {
  const float tensor_part = static_cast<float>(std::hash<std::string>{}(name) % 97);
  return tensor_part + static_cast<float>(index) * 0.25f;
}

inline std::vector<float> synthetic_tensor(const std::string& name,
                                           const std::vector<int64_t>& shape) {
  std::vector<float> v(product(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = synthetic_value(name, static_cast<int64_t>(i));
  return v;
}

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(float));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

inline void write_file(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline void write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// Passes if `status` has `code` and its message contains every one of `parts`.
inline ::testing::AssertionResult status_is(const Status& status, StatusCode code,
                                            std::initializer_list<std::string> parts) {
  if (status.code() != code) {
    return ::testing::AssertionFailure() << "expected " << status_code_name(code) << ", got "
                                         << status.to_string();
  }
  for (const std::string& part : parts) {
    if (status.message().find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message does not contain '" << part
                                           << "': " << status.to_string();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::model::test_util
