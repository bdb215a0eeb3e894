// The deployment file's key checks (private to src/config): one key of a section and its own
// constraint, the tables' walks, and the messages' number formats. Each section's table of keys
// lives in deployment_config.cpp.
#pragma once

#include <array>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"
#include "strata/config/deployment_config.h"

namespace strata::config {

// One key of a section and its own constraint (nullptr: every value of its type is valid). The
// tables below list the keys: config_keys(), validate_key() and each validate() read them.
template <typename Section>
struct KeyCheck {
  std::string_view key;
  Status (*check)(const Section&);
};

inline std::string format_number(double value) {
  std::array<char, 64> buf;
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  return std::string(buf.data(), end);
}

inline Status at_least(std::string_view key, int64_t value, int64_t min) {
  if (value >= min) return Status();
  return invalid_argument_error(std::string(key) + " must be >= " + std::to_string(min) + ", got " +
                                std::to_string(value));
}

inline Status in_range(std::string_view key, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return Status();
  return invalid_argument_error(std::string(key) + " must be in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "], got " + std::to_string(value));
}

// in_range for real numbers, written so that NaN fails too.
inline Status number_in(std::string_view key, double value, double min, double max) {
  if (value >= min && value <= max) return Status();
  return invalid_argument_error(std::string(key) + " must be in [" + format_number(min) + ", " +
                                format_number(max) + "], got " + format_number(value));
}

// at_least for byte sizes, in the files' spelling ("must be >= 1MiB, got 4KiB").
inline Status bytes_at_least(std::string_view key, int64_t value, int64_t min) {
  if (value >= min) return Status();
  const std::string got = value >= 0 ? format_byte_size(value) : std::to_string(value);
  return invalid_argument_error(std::string(key) + " must be >= " + format_byte_size(min) +
                                ", got " + got);
}

inline Status port(std::string_view key, int32_t value) {
  if (value >= 0 && value <= 65535) return Status();
  return invalid_argument_error(std::string(key) + " must be in [0, 65535] (0 disables), got " +
                                std::to_string(value));
}

inline bool is_env_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name) {
    const bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

inline bool has_control(std::string_view s) {
  for (unsigned char c : s) {
    if (c < ' ' || c == 0x7f) return true;
  }
  return false;
}

inline bool has_space_or_control(std::string_view s) {
  for (unsigned char c : s) {
    if (c <= ' ' || c == 0x7f) return true;
  }
  return false;
}

template <typename Section, size_t N>
inline Status check_keys(const KeyCheck<Section> (&table)[N], const Section& section) {
  for (const KeyCheck<Section>& entry : table) {
    if (entry.check) STRATA_RETURN_IF_ERROR(entry.check(section));
  }
  return Status();
}

// Sets `found` and returns the key's check result if `key` is in `table`.
template <typename Section, size_t N>
inline Status check_one_key(const KeyCheck<Section> (&table)[N], const Section& section,
                            std::string_view key, bool& found) {
  for (const KeyCheck<Section>& entry : table) {
    if (entry.key != key) continue;
    found = true;
    return entry.check ? entry.check(section) : Status();
  }
  return Status();
}

template <typename Section, size_t N>
void append_keys(const KeyCheck<Section> (&table)[N], std::vector<std::string_view>& keys) {
  for (const KeyCheck<Section>& entry : table) keys.push_back(entry.key);
}

inline std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace strata::config
