// Wall time for measurements (pass, load and read timings; bench runs): one steady clock.
#pragma once

#include <chrono>

namespace strata {

using SteadyClock = std::chrono::steady_clock;

// Seconds from `start` to now.
inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

}  // namespace strata
