// LeanKV's page manager kernels (kernels/leankv/page_manager.cu) under the emulator against the
// sequential implementation (kv/leankv_pages.h): the same random steps (allocations that fit and
// that do not, partial and full releases, prompt splits) applied to both, the whole state
// (ring, counters, tables, counts) bit-identical after every step, under every schedule. Batches
// range from none to several entries per thread of a 1024-thread block.

#include <gtest/gtest.h>

#include <random>

#include "cuemu/cuemu.h"
#include "emulated_test_util.h"
#include "strata/kernels/ops.h"
#include "support/leankv_page_steps.h"

namespace strata::kernels {
namespace {

using test_util::HostPages;
using test_util::PageOp;
using test_util::PageStep;

void apply_emulated(HostPages& pages, const PageStep& step) {
  switch (step.op) {
    case PageOp::kAllocate:
      launch_leankv_allocate(pages.state(), step.batch(), nullptr);
      break;
    case PageOp::kRelease:
      launch_leankv_release(pages.state(), step.batch(), nullptr);
      break;
    case PageOp::kSplit:
      launch_leankv_split(pages.state(), step.batch(), nullptr);
      break;
  }
}

struct Case {
  int32_t pages, entries, width, max_batch, steps;
};

class LeanKvPagesEmuTest : public ::testing::TestWithParam<Case> {};

TEST_P(LeanKvPagesEmuTest, KernelsMatchTheSequentialManager) {
  const Case c = GetParam();
  for (const cuemu::ScheduleConfig& schedule : testing::emulator_schedules()) {
    SCOPED_TRACE(std::string("schedule ") + cuemu::schedule_name(schedule.schedule));
    cuemu::ScopedSchedule scope(schedule);
    HostPages reference(c.pages, c.entries, c.width);
    HostPages device(c.pages, c.entries, c.width);
    std::mt19937 rng(7 + c.max_batch);
    int shortfalls = 0;
    for (int i = 0; i < c.steps; ++i) {
      SCOPED_TRACE("step " + std::to_string(i));
      const PageStep step = test_util::random_page_step(reference, rng, c.max_batch);
      test_util::apply_sequential(reference, step);
      apply_emulated(device, step);
      shortfalls += step.op == PageOp::kAllocate && reference.counters[kv::leankv::kShortfall] > 0;
      ASSERT_EQ(device.counters, reference.counters);
      ASSERT_EQ(device.ring, reference.ring);
      ASSERT_EQ(device.counts, reference.counts);
      ASSERT_EQ(device.tables, reference.tables);
    }
    EXPECT_GT(shortfalls, 0) << "no allocation ran short";
    EXPECT_GT(reference.counters[kv::leankv::kAllocated], 2 * c.pages) << "the ring did not wrap";
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, LeanKvPagesEmuTest,
                         ::testing::Values(Case{24, 12, 5, 12, 120},        // under one warp
                                           Case{600, 300, 6, 300, 60},      // several warps
                                           Case{8000, 5000, 6, 5000, 30}),  // runs per thread
                         [](const auto& info) {
                           return "batch" + std::to_string(info.param.max_batch);
                         });

}  // namespace
}  // namespace strata::kernels
