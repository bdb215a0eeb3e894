// Status and StatusOr<T>: the error channel for expected failures that cross module boundaries
// (bad input, I/O, capacity, cancellation). Broken invariants use STRATA_CHECK (check.h) instead.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode {
  kOk,
  kInvalidArgument,
  kNotFound,
  kOutOfRange,
  kFailedPrecondition,
  kResourceExhausted,
  kDataLoss,
  kUnimplemented,
  kUnavailable,
  kCancelled,
  kDeadlineExceeded,
  kInternal,
};

const char* status_code_name(StatusCode code);

// Value type; cheap to copy when ok. Thread-compatible.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: <message>", or "OK".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument_error(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status not_found_error(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status out_of_range_error(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status failed_precondition_error(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status resource_exhausted_error(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status data_loss_error(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented_error(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Either a T or a non-ok Status. Accessing value() of an error is a broken invariant (aborts).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : data_(std::move(status)) { check_not_ok(); }  // NOLINT: implicit
  StatusOr(T value) : data_(std::move(value)) {}                          // NOLINT: implicit

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & {
    check_ok();
    return std::get<T>(data_);
  }
  const T& value() const& {
    check_ok();
    return std::get<T>(data_);
  }
  T&& value() && {
    check_ok();
    return std::get<T>(std::move(data_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check_ok() const;
  void check_not_ok() const;
  std::variant<Status, T> data_;
};

namespace detail {
[[noreturn]] void die_on_bad_status_access(const Status& status);
[[noreturn]] void die_on_ok_status_in_status_or();
}  // namespace detail

template <typename T>
void StatusOr<T>::check_ok() const {
  if (!ok()) detail::die_on_bad_status_access(std::get<Status>(data_));
}
template <typename T>
void StatusOr<T>::check_not_ok() const {
  if (std::get<Status>(data_).ok()) detail::die_on_ok_status_in_status_or();
}

}  // namespace strata

#define STRATA_STATUS_CONCAT_INNER(a, b) a##b
#define STRATA_STATUS_CONCAT(a, b) STRATA_STATUS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define STRATA_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::strata::Status strata_status_ = (expr);         \
    if (!strata_status_.ok()) return strata_status_;  \
  } while (0)

// `lhs = value of expr` or return its Status. `lhs` may be a declaration (`auto x`).
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_STATUS_CONCAT(strata_statusor_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
