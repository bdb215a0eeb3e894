// Private to the HTTP server: typed access to the fields of a JSON request body, with the error
// messages the OpenAI front door returns ("<field>: expected a string, got number").
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "strata/common/status.h"

namespace strata::server::openai {

using Json = nlohmann::ordered_json;

inline Status field_error(std::string_view field, std::string_view what) {
  return invalid_argument_error(std::string(field) + ": " + std::string(what));
}

inline Status type_error(std::string_view field, std::string_view expected, const Json& got) {
  return field_error(field, "expected " + std::string(expected) + ", got " + got.type_name());
}

// The value of `name` in `object`; nullptr when absent or null (OpenAI treats null as "not set").
inline const Json* find_field(const Json& object, const std::string& name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

inline StatusOr<std::optional<double>> number_field(const Json& object, const std::string& name) {
  const Json* v = find_field(object, name);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return type_error(name, "a number", *v);
  return std::optional<double>(v->get<double>());
}

inline StatusOr<std::optional<int64_t>> integer_field(const Json& object, const std::string& name) {
  const Json* v = find_field(object, name);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) return type_error(name, "an integer", *v);
  if (v->is_number_unsigned() &&
      v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return field_error(name, "must fit in a signed 64-bit integer");
  }
  return std::optional<int64_t>(v->get<int64_t>());
}

inline StatusOr<std::optional<bool>> bool_field(const Json& object, const std::string& name) {
  const Json* v = find_field(object, name);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return type_error(name, "a boolean", *v);
  return std::optional<bool>(v->get<bool>());
}

inline StatusOr<std::optional<std::string>> string_field(const Json& object,
                                                         const std::string& name) {
  const Json* v = find_field(object, name);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return type_error(name, "a string", *v);
  return std::optional<std::string>(v->get<std::string>());
}

}  // namespace strata::server::openai
