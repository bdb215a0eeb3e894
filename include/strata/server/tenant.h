// The tenant a request's KV-cache entries are salted with, the same on every front door: the API
// key it authenticated with (empty without authentication) and the client's own user id (OpenAI
// `user`, and the gRPC requests' `user`). Requests share cached prompts only within one tenant,
// so no key or user can reuse, or probe by timing, another's prompts.
#pragma once

#include <string>
#include <string_view>

namespace strata::server {

inline std::string tenant_salt(std::string_view api_key, std::string_view user) {
  std::string salt(api_key);
  salt += '\n';  // separator: ("a", "bc") and ("ab", "c") stay distinct
  salt += user;
  return salt;
}

}  // namespace strata::server
