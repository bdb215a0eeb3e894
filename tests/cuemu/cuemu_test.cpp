// The emulator catches what it must (a removed barrier, a missing or outside lane, a race that
// only some schedules expose, unwaited cp.async, divergent barriers, launch limits) and runs what
// is correct identically under every schedule; its warp and tensor-core semantics match values
// worked out by hand from the CUDA / PTX documentation.

#include "cuemu/cuemu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "test_kernels.h"

namespace {

using cuemu::KernelFault;
using cuemu::Schedule;
using cuemu::ScheduleConfig;
using cuemu::ScopedSchedule;

const ScheduleConfig kSchedules[] = {{Schedule::kForward, 0},
                                     {Schedule::kReverse, 0},
                                     {Schedule::kRandom, 1},
                                     {Schedule::kRandom, 2},
                                     {Schedule::kRandom, 3}};

std::vector<float> iota(int n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i) + 0.5f;
  return v;
}

// EXPECT_THROW plus a check of the message.
template <typename F>
void expect_fault(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no fault; expected one mentioning '" << needle << "'";
  } catch (const KernelFault& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Cuemu, CorrectBarrierKernelIsIdenticalUnderEverySchedule) {
  const int n = 256;
  const std::vector<float> in = iota(n);
  for (const ScheduleConfig& s : kSchedules) {
    ScopedSchedule scope(s);
    std::vector<float> out(n, -1.0f);
    cuemu_test::reverse_block(out.data(), in.data(), n, /*with_barrier=*/true);
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(out[i], in[n - 1 - i]) << cuemu::schedule_name(s.schedule);
  }
}

TEST(Cuemu, RemovedBarrierFails) {
  const int n = 256;
  const std::vector<float> in = iota(n);
  for (const ScheduleConfig& s : kSchedules) {
    ScopedSchedule scope(s);
    std::vector<float> out(n, -1.0f);
    cuemu_test::reverse_block(out.data(), in.data(), n, /*with_barrier=*/false);
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += !(out[i] == in[n - 1 - i]);
    EXPECT_GT(wrong, 0) << "schedule " << cuemu::schedule_name(s.schedule)
                        << " did not expose the missing barrier";
  }
}

TEST(Cuemu, ShuffleWithAMissingLaneIsReported) {
  std::vector<float> out(32, 0.0f);
  expect_fault([&] { cuemu_test::shuffle_xor_partial_warp(out.data(), 31); }, "has exited");
  cuemu_test::shuffle_xor_partial_warp(out.data(), 32);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(out[l], static_cast<float>(l ^ 1));
}

TEST(Cuemu, ShuffleReadingOutsideItsMaskIsReported) {
  std::vector<float> out(32, 0.0f);
  expect_fault([&] { cuemu_test::shuffle_outside_mask(out.data()); }, "not in mask 0xffff");
}

TEST(Cuemu, SharedMemoryRaceChangesResultsAcrossSchedules) {
  std::vector<std::vector<float>> results;
  for (const ScheduleConfig& s : kSchedules) {
    ScopedSchedule scope(s);
    std::vector<float> out(64, 0.0f);
    cuemu_test::cross_warp_race(out.data());
    results.push_back(out);
  }
  bool differ = false;
  for (size_t i = 1; i < results.size(); ++i) {
    for (int t = 0; t < 64; ++t) {
      // NaN (the poison) compares unequal to everything, itself included.
      const float a = results[0][t], b = results[i][t];
      differ |= !(a == b) && !(std::isnan(a) && std::isnan(b));
    }
  }
  EXPECT_TRUE(differ) << "the race gave one result under every schedule";
}

TEST(Cuemu, BarrierNotReachedByEveryThreadIsReported) {
  std::vector<float> out(64, 0.0f);
  expect_fault([&] { cuemu_test::divergent_barrier(out.data()); }, "not reached by every thread");
}

TEST(Cuemu, WarpCollectivesFollowTheCudaSemantics) {
  for (const ScheduleConfig& s : kSchedules) {
    ScopedSchedule scope(s);
    std::vector<uint32_t> out(131, 0xdeadbeefu);
    cuemu_test::warp_semantics(out.data());
    for (uint32_t l = 0; l < 32; ++l) {
      EXPECT_EQ(out[l], 50u);
      EXPECT_EQ(out[32 + l], l >= 3 ? l - 3 : l);             // up: low lanes keep theirs
      EXPECT_EQ(out[64 + l], (l % 16) + 3 < 16 ? l + 3 : l);  // down within width 16
      EXPECT_EQ(out[96 + l], 0xaaaaaaaau);
    }
    EXPECT_EQ(out[128], 1u);
    EXPECT_EQ(out[129], 1u);
    EXPECT_EQ(out[130], 0u);
  }
}

TEST(Cuemu, AsyncCopiesLandByTheirWait) {
  const int n = 256;
  const std::vector<float> in = iota(n);
  for (const ScheduleConfig& s : kSchedules) {
    ScopedSchedule scope(s);
    std::vector<float> out(n, 0.0f);
    cuemu_test::async_copy_double(out.data(), in.data(), n, /*wait_before_read=*/true);
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * in[i]);
  }
  // Reading before the wait sees the poison where the copy has not landed (always under the
  // forward schedule, which lands copies only at their wait).
  ScopedSchedule scope({Schedule::kForward, 0});
  std::vector<float> out(n, 0.0f);
  cuemu_test::async_copy_double(out.data(), in.data(), n, /*wait_before_read=*/false);
  EXPECT_TRUE(std::isnan(out[0]));
}

TEST(Cuemu, IllegalAsyncCopiesAreReported) {
  alignas(16) float src[8] = {};
  alignas(16) float dst[4] = {};
  expect_fault([&] { cuemu_test::bad_async_copy(dst, src, 0); }, "not in shared memory");
  expect_fault([&] { cuemu_test::bad_async_copy(dst, src, 1); }, "16-byte aligned");
}

TEST(Cuemu, SharedMemoryIsPoisonedAtEveryBlockStart) {
  std::vector<float> out(64, 0.0f);
  cuemu_test::read_unwritten_shared(out.data(), 64);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

TEST(Cuemu, AtomicsCountEveryThread) {
  int counter = 0;
  cuemu_test::atomic_count(&counter, 5);
  EXPECT_EQ(counter, 5 * 128);
}

TEST(Cuemu, TrapEndsTheLaunch) {
  expect_fault([] { cuemu_test::trap_kernel(); }, "__trap()");
}

TEST(Cuemu, LaunchLimitsAreChecked) {
  expect_fault([] { cuemu_test::launch_with(2048, 0, 0); }, "not a valid block");
  expect_fault([] { cuemu_test::launch_with(128, 64 * 1024, 0); }, "exceed the kernel's limit");
  cuemu_test::launch_with(128, 64 * 1024, 64 * 1024);                      // allowed once raised
  EXPECT_THROW(cuemu_test::launch_with(128, 0, 400 * 1024), KernelFault);  // above the opt-in
  // 200 KiB exceeds an A100's opt-in maximum (163 KiB) and fits an H100's (227 KiB).
  EXPECT_THROW(cuemu_test::launch_with(128, 200 * 1024, 200 * 1024), KernelFault);
  const cuemu::DeviceModel previous = cuemu::set_device(cuemu::h100());
  cuemu_test::launch_with(128, 200 * 1024, 200 * 1024);
  cuemu::set_device(previous);
}

// Tensor cores: ldmatrix + mma.m16n8k16 against a plain fp64 matmul of the rounded inputs.
TEST(Cuemu, MmaMatchesAPlainMatmul) {
  for (bool bf16 : {true, false}) {
    std::vector<float> a(256), b(128), d(128, 0.0f);
    for (int i = 0; i < 256; ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
    for (int i = 0; i < 128; ++i) b[i] = std::cos(0.21f * static_cast<float>(i) + 1.0f);
    const auto round = [bf16](float v) {
      return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
    };
    cuemu_test::mma_16x8x16(d.data(), a.data(), b.data(), bf16);
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 8; ++j) {
        double ref = 0.0;
        for (int k = 0; k < 16; ++k) ref += double{round(a[i * 16 + k])} * round(b[k * 8 + j]);
        EXPECT_NEAR(d[i * 8 + j], ref, 1e-5)
            << (bf16 ? "bf16" : "fp16") << " D[" << i << "][" << j << "]";
      }
    }
  }
}

}  // namespace
