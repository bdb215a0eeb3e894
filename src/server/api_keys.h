// Private to the servers: the one check of an API key, shared by the gRPC and HTTP front doors.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::server {

// The key of `keys` that the credential "Bearer <key>" names, or nullopt. Every key is compared
// in full, without early exit, so the time does not reveal how much of a key matched.
inline std::optional<std::string> match_bearer(std::string_view credential,
                                               const std::vector<std::string>& keys) {
  constexpr std::string_view kBearer = "Bearer ";
  if (!credential.starts_with(kBearer)) return std::nullopt;
  const std::string_view presented = credential.substr(kBearer.size());
  std::optional<std::string> match;
  for (const std::string& key : keys) {
    unsigned char diff = key.size() == presented.size() ? 0 : 1;
    for (size_t i = 0; i < key.size(); ++i) {
      diff |= static_cast<unsigned char>(key[i] ^ (i < presented.size() ? presented[i] : 0));
    }
    if (diff == 0 && !presented.empty()) match = key;
  }
  return match;
}

}  // namespace strata::server
