#include "strata/common/status.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

StatusOr<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument_error("x must be positive, got " + std::to_string(x));
  return x;
}

StatusOr<int> doubled(int x) {
  STRATA_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return 2 * v;
}

TEST(StatusTest, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status().ok());
  Status s = data_loss_error("chunk 7: checksum mismatch");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.to_string(), "DATA_LOSS: chunk 7: checksum mismatch");
}

TEST(StatusTest, AssignOrReturnPropagatesErrors) {
  EXPECT_EQ(doubled(4).value(), 8);
  StatusOr<int> r = doubled(-1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "x must be positive, got -1");
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  StatusOr<int> r = not_found_error("missing");
  EXPECT_DEATH((void)r.value(), "missing");
}

}  // namespace
}  // namespace strata
