// Bytes of tensor parallelism's messages (private to the executor): values in native byte order,
// as the ranks run one binary on one kind of machine.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::executor {

class Writer {
 public:
  template <typename T>
  void put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void bytes(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  // u32 count, then the values.
  template <typename T>
  void span(std::span<const T> values) {
    put(static_cast<uint32_t>(values.size()));
    bytes(values.data(), values.size() * sizeof(T));
  }
  void string(std::string_view s) { span(std::span<const char>(s.data(), s.size())); }
  const std::string& data() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T get() {
    T value{};
    if (const char* p = take(sizeof(T))) std::memcpy(&value, p, sizeof(T));
    return value;
  }
  template <typename T>
  std::vector<T> vector() {
    const size_t n = get<uint32_t>();
    const char* p = take(n * sizeof(T));
    if (p == nullptr) return {};
    std::vector<T> values(n);
    std::memcpy(values.data(), p, n * sizeof(T));
    return values;
  }
  std::string string() {
    std::vector<char> chars = vector<char>();
    return {chars.begin(), chars.end()};
  }
  // n bytes, or null past the end (then ok() is false).
  const char* take(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return nullptr;
    }
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  bool good() const { return ok_; }                      // nothing read past the end
  bool ok() const { return ok_ && pos_ == in_.size(); }  // and everything read
  bool done() const { return !ok_ || pos_ == in_.size(); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace strata::executor
