// STRATA_CHECK: invariants that must hold in a correct program. A failed check prints file, line,
// condition and the streamed message, then aborts. Expected failures use Status (status.h).
#pragma once

#include <sstream>

namespace strata::detail {

// Collects the message of a failed check; aborts in the destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & CheckFailure(...).stream() << msg` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace strata::detail

#define STRATA_CHECK(cond)                \
  (cond) ? (void)0                        \
         : ::strata::detail::Voidify() &  \
               ::strata::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define STRATA_CHECK_EQ(a, b) STRATA_CHECK((a) == (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define STRATA_CHECK_LT(a, b) STRATA_CHECK((a) < (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define STRATA_CHECK_LE(a, b) STRATA_CHECK((a) <= (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
