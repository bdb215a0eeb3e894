// LeanKV's decode-step kernels (kernels/leankv/settle.cu) under the emulator against the libtorch
// references (kernels::aten::leankv_settle_plan / leankv_settle_apply), every schedule, bit for
// bit: the plan's actions and page amounts, then (after the page manager's allocation) the pool's
// bytes and the token counts. The state is 40 entries with random tokens in both sections, counts
// on page boundaries included, scores spread around both thresholds and one tie for the least
// significant token; the test checks that every kind of action occurred. Grid: candidates in
// float32 / fp16 / bf16 x head_dim 64 / 128 x K8V4-K4V2 and K8V8-K2V2 pages.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "emulated_test_util.h"
#include "kernel_tolerance.h"
#include "launch_params.h"
#include "strata/kernels/leankv_ops.h"
#include "strata/kernels/ops.h"
#include "strata/kv/leankv_pages.h"

namespace strata::kernels {
namespace {

using kv::leankv::PageFormat;
using kv::leankv::Precision;
using kv::leankv::PrecisionBits;
using kv::leankv::Tier;

constexpr int64_t kEntries = 40;
constexpr int64_t kWidth = 8;
constexpr int64_t kPages = 600;

struct State {
  at::Tensor pool, ring, counters, tables, counts;
  at::Tensor entries, lengths, candidate;
  kv::leankv::PageManagerState manager() {
    return {ring.data_ptr<int32_t>(),
            counters.data_ptr<int64_t>(),
            tables.data_ptr<int32_t>(),
            page_counts.data_ptr<int32_t>(),
            kPages,
            kEntries,
            kWidth};
  }
  at::Tensor page_counts;
};

// Every kind of action, by construction (T_h = 1 / length, T_l = 0.1 / length): high tokens score
// in [T_l, 2 T_h) (a victim from high is demoted) except a tie of two zeros in one entry (pruned);
// low tokens score 2 u^2 / length for u uniform (about a fifth below T_l, pruned as victims); the
// candidate goes high in entries without high tokens, low in entries without low tokens, and
// high, low or pruned in turn elsewhere (the tie's entry high).
State make_state(const PageFormat& f, int64_t d) {
  State s;
  const auto i32 = at::TensorOptions().dtype(at::kInt);
  s.pool = at::zeros({kPages, f.page_bytes()}, at::kByte);
  s.ring = at::empty({kPages}, i32);
  s.counters = at::empty({kv::leankv::kNumCounters}, at::kLong);
  s.tables = at::empty({kEntries, kWidth}, i32);
  s.page_counts = at::empty({kEntries, 2}, i32);
  s.counts = at::zeros({kEntries, 2}, i32);
  kv::leankv::init_pages(s.manager());
  const int64_t t_high = f.tokens_per_page(Precision::kHigh);
  const int64_t t_low = f.tokens_per_page(Precision::kLow);
  std::vector<int32_t> entries, amounts;
  std::vector<int64_t> lengths;
  for (int32_t e = 0; e < kEntries; ++e) {
    // Counts on page boundaries (0, one and two pages full) for some entries, random for others.
    const int64_t nh =
        e % 5 == 0 ? (e / 5 % 3) * t_high : at::randint(2, 2 * t_high, {1}).item<int64_t>();
    const int64_t nl =
        e % 6 == 0 ? (e / 6 % 3) * t_low : at::randint(1, 2 * t_low, {1}).item<int64_t>();
    entries.push_back(e);
    amounts.push_back(static_cast<int32_t>((nh + t_high - 1) / t_high));
    amounts.push_back(static_cast<int32_t>((nl + t_low - 1) / t_low));
    s.counts[e][0] = static_cast<int32_t>(nh);
    s.counts[e][1] = static_cast<int32_t>(nl);
    lengths.push_back(at::randint(300, 500, {1}).item<int64_t>());
  }
  kv::leankv::allocate_pages(s.manager(), {entries.data(), amounts.data(), kEntries});
  EXPECT_EQ(s.counters[kv::leankv::kShortfall].item<int64_t>(), 0);
  // The step's order is not entry order; its first entry holds at least two high tokens (the tie).
  s.entries = at::randperm(kEntries, at::kLong).to(at::kInt);
  for (int64_t i = 1; s.counts[s.entries[0].item<int>()][0].item<int>() < 2; ++i) {
    const at::Tensor first = s.entries[0].clone();
    s.entries[0] = s.entries[i];
    s.entries[i] = first;
  }
  s.lengths = at::tensor(lengths, at::kLong).index_select(0, s.entries.to(at::kLong));
  const at::Tensor item_counts = s.counts.index_select(0, s.entries.to(at::kLong)).to(at::kLong);
  for (const Precision p : {Precision::kHigh, Precision::kLow}) {
    const auto [page, slot] = aten::leankv_token_slots(f, p, s.tables, s.counts, s.entries);
    const at::Tensor length_of =
        at::repeat_interleave(s.lengths, item_counts.select(1, static_cast<int64_t>(p)));
    const int64_t m = page.size(0);
    const at::Tensor position = (at::rand({m}) * (length_of - 20).to(at::kFloat)).to(at::kInt);
    const at::Tensor later = (length_of - 1 - position.to(at::kLong)).to(at::kFloat);
    const at::Tensor u = at::rand({m});
    const at::Tensor score = p == Precision::kHigh ? 0.1f + 1.9f * u : 2 * u * u;
    at::Tensor acc = score * later / length_of.to(at::kFloat);
    if (p == Precision::kHigh) acc.narrow(0, 0, 2).zero_();  // item 0 has at least two
    aten::leankv_write_tokens(s.pool, f, p, page, slot, at::randn({m, d}) * 2, at::randn({m, d}),
                              acc, position);
  }
  std::vector<float> candidate;
  for (int64_t i = 0; i < kEntries; ++i) {
    const int64_t nh = item_counts[i][0].item<int64_t>(), nl = item_counts[i][1].item<int64_t>();
    const int turn = i == 0 || nh == 0 ? 0 : nl == 0 ? 1 : i % 3;
    const float score[3] = {1.5f, 0.5f, 0.01f};  // high, low, pruned
    candidate.push_back(score[turn] / static_cast<float>(s.lengths[i].item<int64_t>()));
  }
  s.candidate = at::tensor(candidate, at::kFloat);
  return s;
}

using Params = std::tuple<at::ScalarType, int64_t, bool>;

class LeanKvSettleEmuTest : public ::testing::TestWithParam<Params> {};

TEST_P(LeanKvSettleEmuTest, PlanAndApplyBitIdenticalToReference) {
  const auto [dtype, d, wide] = GetParam();
  const PageFormat f =
      wide ? PageFormat::create(d, PrecisionBits{8, 8}, PrecisionBits{2, 2}, 16).value()
           : PageFormat::create(d, PrecisionBits{8, 4}, PrecisionBits{4, 2}, 16).value();
  at::manual_seed(d + 3 * wide + static_cast<int>(dtype));
  State s = make_state(f, d);
  const kv::leankv::Thresholds thresholds{1.0, 0.1, 8};

  // The plan.
  const auto [actions, amounts] = aten::leankv_settle_plan(s.pool, f, s.tables, s.counts, s.entries,
                                                           s.lengths, s.candidate, thresholds);
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor a = at::full({kEntries, 3}, -7, at::kInt),
                   n = at::full({kEntries, 2}, -7, at::kInt);
        launch_leankv_settle_plan(
            leankv_settle_params(s.pool, f, s.tables, s.counts, s.entries, s.lengths, s.candidate,
                                 thresholds, a, n, {}, {}, {}, {}),
            nullptr);
        return at::cat({a, n}, 1);
      },
      at::cat({actions, amounts}, 1), 0.0, 0.0);

  // Every kind of action occurred (else the state above no longer tests them all).
  std::set<std::tuple<int, bool, int>> kinds;  // candidate tier, has victim, victim's tier
  for (int64_t i = 0; i < kEntries; ++i) {
    const int victim = actions[i][1].item<int>();
    kinds.insert(
        {actions[i][0].item<int>(), victim >= 0, victim >= 0 ? actions[i][2].item<int>() : -1});
  }
  const int high = static_cast<int>(Tier::kHigh), low = static_cast<int>(Tier::kLow),
            pruned = static_cast<int>(Tier::kPruned);
  for (const auto& kind :
       {std::tuple{high, false, -1}, std::tuple{high, true, low}, std::tuple{high, true, pruned},
        std::tuple{low, false, -1}, std::tuple{low, true, pruned}, std::tuple{pruned, false, -1}}) {
    EXPECT_TRUE(kinds.contains(kind)) << "no action (" << std::get<0>(kind) << ", "
                                      << std::get<1>(kind) << ", " << std::get<2>(kind) << ")";
  }
  EXPECT_GT(amounts.sum().item<int64_t>(), 0) << "no section needed a page";

  // The step's pages, then the apply.
  const at::Tensor needy = s.entries.contiguous();
  kv::leankv::allocate_pages(s.manager(),
                             {needy.data_ptr<int32_t>(), amounts.data_ptr<int32_t>(), kEntries});
  ASSERT_EQ(s.counters[kv::leankv::kShortfall].item<int64_t>(), 0);
  const at::Tensor key = (at::randn({kEntries, d}) * 3).to(dtype);
  const at::Tensor value = at::randn({kEntries, d}).to(dtype);
  const at::Tensor acc = at::rand({kEntries});
  const at::Tensor position = s.lengths.to(at::kInt) - 9;
  at::Tensor pool_ref = s.pool.clone(), counts_ref = s.counts.clone();
  aten::leankv_settle_apply(pool_ref, f, s.tables, counts_ref, s.entries, actions, key, value, acc,
                            position);
  EXPECT_FALSE(at::equal(pool_ref, s.pool));
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor pool = s.pool.clone(), counts = s.counts.clone(), a = actions.clone(), n;
        launch_leankv_settle_apply(
            leankv_settle_params(pool, f, s.tables, counts, s.entries, {}, {}, thresholds, a, n,
                                 key, value, acc, position),
            nullptr);
        return at::cat({pool.view({-1}).to(at::kInt), counts.view({-1})});
      },
      at::cat({pool_ref.view({-1}).to(at::kInt), counts_ref.view({-1})}), 0.0, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Grid, LeanKvSettleEmuTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 128), ::testing::Bool()),
                         [](const auto& info) {
                           return testing::dtype_label(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_k8v8_k2v2" : "_k8v4_k4v2");
                         });

}  // namespace
}  // namespace strata::kernels
