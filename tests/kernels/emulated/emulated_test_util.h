// Helpers for the emulator tests of the kernels: the schedules every case runs under, and the
// comparison every GPU test makes (tests/kernels/kernel_test_util.h's tolerances).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuemu/cuemu.h"

namespace strata::kernels::testing {

// Forward, reverse and one seeded random order; results must be identical under all of them.
inline std::vector<cuemu::ScheduleConfig> emulator_schedules() {
  return {{cuemu::Schedule::kForward, 0},
          {cuemu::Schedule::kReverse, 0},
          {cuemu::Schedule::kRandom, 20261124}};
}

// Runs `run` (which returns the kernel's output as a CPU tensor) under every schedule; checks
// each result against `ref` within `rtol`/`atol` and all results bit-identical to the first.
template <typename Run>
void expect_schedule_invariant_match(Run&& run, const at::Tensor& ref, double rtol, double atol) {
  at::Tensor first;
  for (const cuemu::ScheduleConfig& s : emulator_schedules()) {
    SCOPED_TRACE(std::string("schedule ") + cuemu::schedule_name(s.schedule));
    cuemu::ScopedSchedule scope(s);
    const at::Tensor out = run();
    ASSERT_EQ(out.sizes(), ref.sizes());
    EXPECT_FALSE(out.isnan().any().item<bool>()) << "NaN in the output";
    EXPECT_TRUE(at::allclose(out.to(at::kFloat), ref.to(at::kFloat), rtol, atol))
        << "max diff " << (out.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>();
    if (!first.defined()) {
      first = out;
    } else {
      EXPECT_TRUE(at::equal(out, first)) << "result differs from the forward schedule's";
    }
  }
}

}  // namespace strata::kernels::testing
