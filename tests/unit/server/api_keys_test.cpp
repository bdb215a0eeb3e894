// The one API-key check of both front doors.
#include "api_keys.h"

#include <gtest/gtest.h>

namespace strata::server {
namespace {

TEST(MatchBearerTest, OnlyAWholeConfiguredKeyMatches) {
  const std::vector<std::string> keys = {"key-a", "key-bb"};
  EXPECT_EQ(match_bearer("Bearer key-a", keys), std::optional<std::string>("key-a"));
  EXPECT_EQ(match_bearer("Bearer key-bb", keys), std::optional<std::string>("key-bb"));
  for (const char* wrong : {"Bearer key-", "Bearer key-a ", "Bearer key-b", "Bearer KEY-A",
                            "key-a", "Bearer ", "", "Basic key-a", "Bearer key-bbb"}) {
    EXPECT_FALSE(match_bearer(wrong, keys).has_value()) << wrong;
  }
  EXPECT_FALSE(match_bearer("Bearer ", {""}).has_value()) << "an empty key never matches";
  EXPECT_FALSE(match_bearer("Bearer x", {}).has_value());
}

}  // namespace
}  // namespace strata::server
