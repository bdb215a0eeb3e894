// Private to the servers: the public ids of requests, unguessable (128 random bits), so that
// knowing one's own id says nothing about another client's.
#pragma once

#include <cstdio>
#include <random>
#include <string>
#include <string_view>

namespace strata::server {

// `prefix` followed by 32 random hex digits ("req-", "chatcmpl-").
inline std::string random_request_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char digits[33];
  std::snprintf(digits, sizeof(digits), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return std::string(prefix) + digits;
}

}  // namespace strata::server
