// FreeKV's kernels (kernels/freekv/) under the emulator against the libtorch references
// (kernels::aten::freekv_*, freekv_ops.h), every schedule:
//   select     the page scores within float tolerance of the reference, and the selection
//              exactly the top k of the kernel's own scores (ascending, ties to the lower page);
//              the reference's selection whenever no two scores at its boundary are within
//              tolerance. fp16 / bf16 x head_dim 64 / 128 x GQA groups 1, 3, 8 x 1, 9 and 300
//              pages x top 1, 5 and all; and a case of tied pages.
//   pages      offload (NHD rows -> HND page, min/max summary) and recall (HND chunks and a
//              delta from the other buffer -> NHD slots) bit-identical to the reference, and the
//              round trip restores the rows. float32 / fp16 / bf16 x head_dim 64 / 128 x pages of
//              16 / 32 tokens x 1 and 3 KV heads.
//   attention  within the dtype's tolerance of the reference over fp16 / bf16 x head_dim 64 /
//              128 x GQA 1, 3, 8 x pages of 16 / 32 tokens x ragged slots per head (none, some,
//              all) x 1 or 40 resident tokens; what lies past a head's slots is NaN (read it and
//              the output is NaN).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "emulated_ops.h"
#include "emulated_test_util.h"
#include "kernel_tolerance.h"
#include "launch_params.h"
#include "strata/kernels/freekv_ops.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

// (query heads, KV heads): GQA groups of 1, 3 and 8.
const std::vector<std::pair<int64_t, int64_t>> kHeadShapes = {{2, 2}, {9, 3}, {16, 2}};

// The kernel's selection of top_k pages per KV head, and its scores, as one float tensor
// [n_kv, top_k + n_page] (selected page numbers first).
at::Tensor run_select(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                      int64_t top_k, double scale) {
  const auto [selected, scores] =
      testing::emulated_freekv_select_scores(q, kmin, kmax, top_k, scale);
  return at::cat({selected.to(at::kFloat), scores}, 1);
}

// The top k of each row of scores, ascending, ties to the lower page (the reference's rule).
at::Tensor top_k_of(const at::Tensor& scores, int64_t k) {
  const at::Tensor order = std::get<1>(at::sort(scores, /*stable=*/true, -1, /*descending=*/true));
  return std::get<0>(at::sort(order.narrow(1, 0, k), -1));
}

using SelectParams = std::tuple<at::ScalarType, int64_t, int, int64_t, int64_t>;

class FreeKvSelectEmuTest : public ::testing::TestWithParam<SelectParams> {};

TEST_P(FreeKvSelectEmuTest, ScoresAndSelectsLikeTheReference) {
  const auto [dtype, d, shape, pages, top] = GetParam();
  const auto [heads, kv] = kHeadShapes[shape];
  const int64_t k = std::min(top, pages);
  at::manual_seed(d + 7 * shape + 13 * pages + top);
  const at::Tensor q = at::randn({heads, d}).to(dtype);
  const at::Tensor keys = at::randn({pages, kv, 16, d}) * 2;
  auto [kmin, kmax] = aten::freekv_summaries(keys);
  kmin = kmin.to(dtype);
  kmax = kmax.to(dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  const at::Tensor want_scores = aten::freekv_page_scores(q, kmin, kmax, scale);
  at::Tensor first;
  for (const cuemu::ScheduleConfig& s : testing::emulator_schedules()) {
    SCOPED_TRACE(std::string("schedule ") + cuemu::schedule_name(s.schedule));
    cuemu::ScopedSchedule scope(s);
    const at::Tensor out = run_select(q, kmin, kmax, k, scale);
    const at::Tensor selected = out.narrow(1, 0, k).to(at::kLong);
    const at::Tensor scores = out.narrow(1, k, pages);
    ASSERT_TRUE(at::allclose(scores, want_scores, 1e-4, 1e-7))
        << "max diff " << testing::max_abs_diff(scores, want_scores);
    EXPECT_TRUE(at::equal(selected, top_k_of(scores, k))) << selected << top_k_of(scores, k);
    // The reference's selection, unless its boundary is a near tie.
    const at::Tensor sorted = std::get<0>(at::sort(want_scores, -1, /*descending=*/true));
    const bool clear =
        k == pages ||
        (sorted.narrow(1, k - 1, 1) - sorted.narrow(1, k, 1)).min().item<double>() > 1e-5;
    if (clear) {
      EXPECT_TRUE(at::equal(selected, aten::freekv_select(q, kmin, kmax, k, scale)));
    }
    if (!first.defined()) {
      first = out;
    } else {
      EXPECT_TRUE(at::equal(out, first)) << "result differs from the forward schedule's";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, FreeKvSelectEmuTest,
                         ::testing::Combine(::testing::Values(at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 128),
                                            ::testing::Values(0, 1, 2),
                                            ::testing::Values<int64_t>(1, 9, 300),
                                            ::testing::Values<int64_t>(1, 5, 1000)));

TEST(FreeKvSelectEmuTest, TiedPagesGoToTheLowerPage) {
  // Pages 0..9 repeat as 10..19 and 20..29: every score appears three times.
  at::manual_seed(3);
  const at::Tensor q = at::randn({9, 64}).to(at::kHalf);
  auto [kmin, kmax] = aten::freekv_summaries(at::randn({10, 3, 16, 64}).repeat({3, 1, 1, 1}));
  kmin = kmin.to(at::kHalf);
  kmax = kmax.to(at::kHalf);
  for (int64_t k : {1, 2, 4, 7, 29}) {
    SCOPED_TRACE("top " + std::to_string(k));
    const at::Tensor selected = run_select(q, kmin, kmax, k, 0.125).narrow(1, 0, k).to(at::kLong);
    EXPECT_TRUE(at::equal(selected, aten::freekv_select(q, kmin, kmax, k, 0.125))) << selected;
  }
}

using PagesParams = std::tuple<at::ScalarType, int64_t, int64_t, int64_t>;

class FreeKvPagesEmuTest : public ::testing::TestWithParam<PagesParams> {};

TEST_P(FreeKvPagesEmuTest, OffloadAndRecallCopyLikeTheReference) {
  const auto [dtype, d, p, kv] = GetParam();
  constexpr int64_t kCapacity = 4;
  at::manual_seed(d + p + kv);
  const at::Tensor rows_k = at::randn({p, kv, d}).to(dtype);
  const at::Tensor rows_v = at::randn({p, kv, d}).to(dtype);
  // Three staged chunks (page, head) of other pages, plus the offloaded page's chunks.
  const at::Tensor staged = at::randn({3, 2, p, d}).to(dtype);
  const at::Tensor from_k = at::randn({kCapacity, p, kv, d}).to(dtype);
  const at::Tensor from_v = at::randn({kCapacity, p, kv, d}).to(dtype);
  // Items: head m gets the offloaded page in slot m, a staged chunk in slot 3 - m when free, and
  // head 0 a delta from the other buffer's slot 2 into slot 1 when that is free.
  std::vector<int32_t> flat;
  for (int64_t m = 0; m < kv; ++m) {
    flat.insert(flat.end(),
                {static_cast<int32_t>(m), static_cast<int32_t>(m), static_cast<int32_t>(3 + m)});
    if (3 - m != m) {
      flat.insert(flat.end(), {static_cast<int32_t>(m), static_cast<int32_t>(3 - m),
                               static_cast<int32_t>(m % 3)});
    }
  }
  if (kv == 1) flat.insert(flat.end(), {0, 1, -3});
  const at::Tensor items = at::tensor(flat, at::kInt).view({-1, 3});

  at::Tensor want_page = at::empty({kv, 2, p, d}, dtype);
  at::Tensor want_lo = at::empty({kv, d}, dtype), want_hi = at::empty({kv, d}, dtype);
  aten::freekv_offload(rows_k, rows_v, want_page, want_lo, want_hi);
  const at::Tensor want_chunks = at::cat({staged, want_page});
  at::Tensor want_k = at::full({kCapacity, p, kv, d}, NAN).to(dtype);
  at::Tensor want_v = want_k.clone();
  aten::freekv_recall(want_chunks, items, want_k, want_v, from_k, from_v);
  // The round trip: slot m of head m holds head m's rows.
  for (int64_t m = 0; m < kv; ++m) {
    ASSERT_TRUE(at::equal(want_k[m].select(1, m), rows_k.select(1, m)));
    ASSERT_TRUE(at::equal(want_v[m].select(1, m), rows_v.select(1, m)));
  }

  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor page = at::full({kv, 2, p, d}, NAN).to(dtype);
        at::Tensor lo = at::full({kv, d}, NAN).to(dtype), hi = lo.clone();
        FreeKvOffloadParams op = freekv_offload_params(rows_k, rows_v, page, lo, hi);
        launch_freekv_offload(op, nullptr);
        const at::Tensor chunks = at::cat({staged, page});
        at::Tensor cache_k = at::full({kCapacity, p, kv, d}, NAN).to(dtype);
        at::Tensor cache_v = cache_k.clone();
        launch_freekv_recall(freekv_recall_params(chunks, items, cache_k, cache_v, from_k, from_v),
                             nullptr);
        // Unwritten slots stay NaN in both: compare them as zeros.
        return at::cat({page.flatten(), lo.flatten(), hi.flatten(), cache_k.nan_to_num(0).flatten(),
                        cache_v.nan_to_num(0).flatten()});
      },
      at::cat({want_page.flatten(), want_lo.flatten(), want_hi.flatten(),
               want_k.nan_to_num(0).flatten(), want_v.nan_to_num(0).flatten()}),
      0.0, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Grid, FreeKvPagesEmuTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 128),
                                            ::testing::Values<int64_t>(16, 32),
                                            ::testing::Values<int64_t>(1, 3)));

// A recall of deltas only (every page already in the other buffer) comes with no chunk at all:
// the reference and the kernel copy the slots, nothing else.
TEST(FreeKvPagesEmuTest, DeltasOnlyNeedNoChunk) {
  at::manual_seed(5);
  const at::Tensor from_k = at::randn({3, 16, 2, 64}).to(at::kHalf);
  const at::Tensor from_v = at::randn({3, 16, 2, 64}).to(at::kHalf);
  const at::Tensor chunks = at::empty({0, 2, 16, 64}, at::kHalf);
  const at::Tensor items = at::tensor({0, 0, -3, 1, 2, -1}, at::kInt).view({-1, 3});
  at::Tensor want_k = at::zeros_like(from_k), want_v = at::zeros_like(from_v);
  aten::freekv_recall(chunks, items, want_k, want_v, from_k, from_v);
  EXPECT_TRUE(at::equal(want_k[0].select(1, 0), from_k[2].select(1, 0)));
  EXPECT_TRUE(at::equal(want_v[2].select(1, 1), from_v[0].select(1, 1)));
  at::Tensor got_k = at::zeros_like(from_k), got_v = at::zeros_like(from_v);
  launch_freekv_recall(freekv_recall_params(chunks, items, got_k, got_v, from_k, from_v), nullptr);
  EXPECT_TRUE(at::equal(got_k, want_k));
  EXPECT_TRUE(at::equal(got_v, want_v));
}

using AttentionParams = std::tuple<at::ScalarType, int64_t, int, int64_t, int64_t>;

class FreeKvAttentionEmuTest : public ::testing::TestWithParam<AttentionParams> {};

TEST_P(FreeKvAttentionEmuTest, AttendsLikeTheReference) {
  const auto [dtype, d, shape, p, resident] = GetParam();
  const auto [heads, kv] = kHeadShapes[shape];
  constexpr int64_t kCapacity = 3;
  at::manual_seed(d + 3 * shape + p + resident);
  const at::Tensor q = at::randn({heads, d}).to(dtype);
  const at::Tensor resident_k = (at::randn({resident, kv, d}) * 2).to(dtype);
  const at::Tensor resident_v = at::randn({resident, kv, d}).to(dtype);
  // Slots per head: none, some, all (cycling); past them NaN.
  std::vector<int64_t> counts;
  for (int64_t m = 0; m < kv; ++m) counts.push_back((m + shape) % (kCapacity + 1));
  const at::Tensor slots = at::tensor(counts, at::kLong);
  at::Tensor cache_k = (at::randn({kCapacity, p, kv, d}) * 2).to(dtype);
  at::Tensor cache_v = at::randn({kCapacity, p, kv, d}).to(dtype);
  for (int64_t m = 0; m < kv; ++m) {
    cache_k.narrow(0, counts[m], kCapacity - counts[m]).select(2, m).fill_(NAN);
    cache_v.narrow(0, counts[m], kCapacity - counts[m]).select(2, m).fill_(NAN);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::Tensor want =
      aten::freekv_attention(q, resident_k, resident_v, cache_k, cache_v, slots, scale);
  const testing::Tolerance tol = testing::tolerance_for(dtype);
  testing::expect_schedule_invariant_match(
      [&] {
        return testing::emulated_freekv_attention(q, resident_k, resident_v, cache_k, cache_v,
                                                  slots, scale);
      },
      want, tol.rtol, tol.atol);
}

INSTANTIATE_TEST_SUITE_P(Grid, FreeKvAttentionEmuTest,
                         ::testing::Combine(::testing::Values(at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 128),
                                            ::testing::Values(0, 1, 2),
                                            ::testing::Values<int64_t>(16, 32),
                                            ::testing::Values<int64_t>(1, 40)));

}  // namespace
}  // namespace strata::kernels
