// LeanKV's decode attention kernel (kernels/leankv/decode_attention.cu) under the emulator against
// the libtorch reference (kernels::aten::leankv_decode_attention), every schedule: the output, the
// accumulators it adds to the pages' scores segments and to the window's, and nothing else in
// the pool changed. Grid: fp16 / bf16 x head_dim 64 / 128 x GQA groups 1, 3, 8 x two page formats
// (K8V4 / K4V2, and K8V8 / K2V2: every bit width on both K and V) x pages of 16 / 32 high
// tokens; three sequences of two KV heads with ragged counts (empty sections, partial pages,
// several pages) and window lengths 1..8 (a head attending to one token included).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "emulated_test_util.h"
#include "kernel_tolerance.h"
#include "launch_params.h"
#include "strata/kernels/leankv_ops.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using kv::leankv::PageFormat;
using kv::leankv::Precision;
using kv::leankv::PrecisionBits;

struct LeanCase {
  at::Tensor pool, tables, token_counts, entries, q, window, window_lens, window_acc;
  int64_t max_tokens = 0;
};

LeanCase make_case(const PageFormat& f, at::ScalarType dtype, int64_t heads, int64_t seed) {
  constexpr int64_t kSeqs = 3, kKvHeads = 2, kWidth = 10, kWindow = 8;
  const int64_t d = f.head_dim();
  at::manual_seed(seed);
  // (high, low) tokens per entry 2 * s + h: empty sections, partial pages, several pages.
  const std::vector<std::pair<int64_t, int64_t>> counts = {{0, 0},  {1, 0},   {33, 57},
                                                           {70, 1}, {0, 120}, {31, 5}};
  const int64_t th = f.tokens_per_page(Precision::kHigh), tl = f.tokens_per_page(Precision::kLow);
  LeanCase c;
  c.tables = at::full({kSeqs * kKvHeads, kWidth}, -1, at::kInt);
  c.token_counts = at::zeros({kSeqs * kKvHeads, 2}, at::kInt);
  // Pages handed out in a scrambled order, as a ring that wrapped would.
  const at::Tensor order = at::randperm(64, at::kInt);
  int64_t next = 0;
  for (int64_t e = 0; e < kSeqs * kKvHeads; ++e) {
    const auto [high, low] = counts[e];
    for (int64_t i = 0; i < (high + th - 1) / th; ++i) c.tables[e][i] = order[next++];
    for (int64_t j = 0; j < (low + tl - 1) / tl; ++j) c.tables[e][kWidth - 1 - j] = order[next++];
    c.token_counts[e][0] = high;
    c.token_counts[e][1] = low;
  }
  c.pool = at::randint(0, 256, {64, f.page_bytes()}, at::kByte);  // unwritten bytes: noise
  for (int64_t e = 0; e < kSeqs * kKvHeads; ++e) {
    for (Precision p : {Precision::kHigh, Precision::kLow}) {
      const auto [page, slot] =
          aten::leankv_token_slots(f, p, c.tables, c.token_counts, at::full({1}, e, at::kLong));
      const int64_t m = page.size(0);
      aten::leankv_write_tokens(c.pool, f, p, page, slot, at::randn({m, d}) * 2, at::randn({m, d}),
                                at::rand({m}), at::arange(m, at::kInt));
    }
  }
  c.entries = at::arange(kSeqs * kKvHeads, at::kInt).view({kSeqs, kKvHeads});
  c.q = at::randn({kSeqs, heads, d}).to(dtype);
  c.window = at::randn({kSeqs, 2, kKvHeads, kWindow, d}).to(dtype);
  c.window_lens = at::tensor(std::vector<int32_t>{1, 8, 5});
  c.window_acc = at::rand({kSeqs, kKvHeads, kWindow});
  c.max_tokens = 130;
  return c;
}

using Params = std::tuple<at::ScalarType, int64_t, int64_t, bool, int32_t>;

class LeanKvDecodeEmuTest : public ::testing::TestWithParam<Params> {};

TEST_P(LeanKvDecodeEmuTest, MatchesReference) {
  const auto [dtype, head_dim, group, wide_formats, high_tokens] = GetParam();
  const PageFormat f =
      wide_formats
          ? PageFormat::create(head_dim, PrecisionBits{8, 8}, PrecisionBits{2, 2}, high_tokens)
                .value()
          : PageFormat::create(head_dim, PrecisionBits{8, 4}, PrecisionBits{4, 2}, high_tokens)
                .value();
  const LeanCase c = make_case(f, dtype, 2 * group, head_dim + group);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));

  at::Tensor ref_pool = c.pool.clone(), ref_window_acc = c.window_acc.clone();
  const at::Tensor ref_out =
      aten::leankv_decode_attention(c.q, ref_pool, f, c.tables, c.token_counts, c.entries, c.window,
                                    c.window_lens, ref_window_acc, scale);
  const testing::Tolerance tol = testing::tolerance_for(dtype);
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor pool = c.pool.clone(), window_acc = c.window_acc.clone();
        at::Tensor out = at::empty_like(c.q);
        LeanKvDecodeParams params =
            leankv_decode_params(out, c.q, pool, f, c.tables, c.token_counts, c.entries, c.window,
                                 c.window_lens, window_acc, c.max_tokens, scale);
        at::Tensor workspace = at::full(
            {static_cast<int64_t>(leankv_decode_workspace_bytes(params))}, 0xFF, at::kByte);
        params.workspace = reinterpret_cast<float*>(workspace.data_ptr());
        launch_leankv_decode_attention(params, nullptr);
        EXPECT_TRUE(at::allclose(window_acc, ref_window_acc, 1e-5, 1e-5))
            << testing::max_abs_diff(window_acc, ref_window_acc);
        // Accumulators compare as floats; every other byte of the pool is unchanged.
        at::Tensor scores = at::zeros_like(pool, at::kBool);
        for (Precision p : {Precision::kHigh, Precision::kLow}) {
          const kv::leankv::PageSegments& s = f.segments(p);
          for (int64_t e = 0; e < c.tables.size(0); ++e) {
            const auto [page, slot] = aten::leankv_token_slots(f, p, c.tables, c.token_counts,
                                                               at::full({1}, e, at::kLong));
            const at::Tensor got = std::get<2>(aten::leankv_read_tokens(pool, f, p, page, slot));
            const at::Tensor want =
                std::get<2>(aten::leankv_read_tokens(ref_pool, f, p, page, slot));
            EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << testing::max_abs_diff(got, want);
            for (int64_t i = 0; i < page.size(0); ++i) {
              const int64_t at_byte = s.scores + 4 * slot[i].item<int64_t>();
              scores[page[i].item<int64_t>()].slice(0, at_byte, at_byte + 4).fill_(true);
            }
          }
        }
        EXPECT_TRUE(at::equal(pool.masked_select(scores.logical_not()),
                              c.pool.masked_select(scores.logical_not())));
        return out;
      },
      ref_out, tol.rtol, tol.atol);
}

INSTANTIATE_TEST_SUITE_P(Grid, LeanKvDecodeEmuTest,
                         ::testing::Combine(::testing::Values(at::kHalf, at::kBFloat16),
                                            ::testing::Values<int64_t>(64, 128),
                                            ::testing::Values<int64_t>(1, 3, 8), ::testing::Bool(),
                                            ::testing::Values<int32_t>(16, 32)),
                         [](const auto& info) {
                           return testing::dtype_label(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + "_g" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_k8v8_k2v2" : "_k8v4_k4v2") + "_t" +
                                  std::to_string(std::get<4>(info.param));
                         });

}  // namespace
}  // namespace strata::kernels
