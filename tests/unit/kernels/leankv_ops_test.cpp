// LeanKV's page format (kv/leankv_page_format.h) and its libtorch operations
// (kernels/leankv_ops.h): segment offsets worked out by hand, quantize-on-append and
// dequantize-on-read (bytes where the format says, error within half a quantization step, nothing
// else in the pool touched), prompt significance against a loop over the full attention matrix,
// and decode attention over high pages, low pages and the window against plain softmax attention
// over the dequantized tokens, with the accumulators each token's attention adds (libtorch's and
// Strata's CPU loop, which is also compared with libtorch's over a grid of formats and dtypes).

#include "strata/kernels/leankv_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "strata/kernels/cpu_ops.h"

namespace strata::kernels::aten {
namespace {

using kv::leankv::PageFormat;
using kv::leankv::Precision;
using kv::leankv::PrecisionBits;

PageFormat format_of(int64_t head_dim) {
  return PageFormat::create(head_dim, PrecisionBits{8, 4}, PrecisionBits{4, 2}, 32).value();
}

TEST(LeanKvPageFormat, SegmentsOfK8V4AndK4V2Pages) {
  const PageFormat f = format_of(64);
  // High token: 64 B key + 32 B value + 4 + 4 params + 4 score + 4 position = 112 B; 32 of them.
  EXPECT_EQ(f.token_bytes(Precision::kHigh), 112);
  EXPECT_EQ(f.page_bytes(), 3584);
  const kv::leankv::PageSegments& high = f.segments(Precision::kHigh);
  EXPECT_EQ(high.key_chunk, 64);
  EXPECT_EQ(std::vector<int64_t>({high.key_params, high.value_data, high.value_params, high.scores,
                                  high.positions, high.end}),
            std::vector<int64_t>({2048, 2176, 3200, 3328, 3456, 3584}));
  // Low token: 32 + 16 + 16 = 64 B: 56 fit (a multiple of 8).
  EXPECT_EQ(f.tokens_per_page(Precision::kLow), 56);
  const kv::leankv::PageSegments& low = f.segments(Precision::kLow);
  EXPECT_EQ(low.key_chunk, 32);
  EXPECT_EQ(low.value_chunk, 16);
  EXPECT_EQ(std::vector<int64_t>({low.key_params, low.value_data, low.value_params, low.scores,
                                  low.positions, low.end}),
            std::vector<int64_t>({1792, 2016, 2912, 3136, 3360, 3584}));
  const PageFormat wide = format_of(128);  // 208 B per high token; 112 per low: 59 -> 56
  EXPECT_EQ(wide.page_bytes(), 6656);
  EXPECT_EQ(wide.segments(Precision::kHigh).key_chunk, 64);
  EXPECT_EQ(wide.tokens_per_page(Precision::kLow), 56);
  EXPECT_LE(wide.segments(Precision::kLow).end, wide.page_bytes());

  EXPECT_FALSE(PageFormat::create(64, {8, 3}, {4, 2}, 32).ok());
  EXPECT_FALSE(PageFormat::create(64, {4, 2}, {8, 4}, 32).ok());  // low above high
  EXPECT_FALSE(PageFormat::create(48, {8, 4}, {4, 2}, 32).ok());  // 12-byte V2 rows
  EXPECT_FALSE(PageFormat::create(64, {8, 4}, {4, 2}, 0).ok());
}

class LeanKvTokensTest : public ::testing::TestWithParam<std::tuple<int64_t, Precision>> {};

TEST_P(LeanKvTokensTest, WriteThenReadRoundTrips) {
  const auto [head_dim, precision] = GetParam();
  const PageFormat f = format_of(head_dim);
  const int64_t tokens = f.tokens_per_page(precision);
  at::manual_seed(3);
  at::Tensor pool = at::full({4, f.page_bytes()}, 0xAB, at::kByte);
  const at::Tensor before = pool.clone();
  // 9 tokens over pages 1 and 3, the last slot of page 3 included.
  const at::Tensor page = at::tensor(std::vector<int64_t>{1, 1, 3, 3, 1, 3, 1, 3, 3});
  const at::Tensor slot =
      at::tensor(std::vector<int64_t>{0, 5, tokens - 1, 2, tokens - 2, 0, 7, 9, 4});
  const at::Tensor key = at::randn({9, head_dim}) * 3;
  at::Tensor value = at::randn({9, head_dim});
  value[4].fill_(0.25);  // max == min: scale 0
  const at::Tensor acc = at::rand({9});
  const at::Tensor position = at::arange(100, 109, at::kInt);
  leankv_write_tokens(pool, f, precision, page, slot, key, value.to(at::kBFloat16), acc, position);
  const auto [back_key, back_value, back_acc, back_position] =
      leankv_read_tokens(pool, f, precision, page, slot);
  EXPECT_TRUE(at::equal(back_acc, acc));
  EXPECT_TRUE(at::equal(back_position, position));
  const PrecisionBits bits = f.bits(precision);
  for (const auto& [x, y, b] :
       {std::tuple{key, back_key, bits.key},
        std::tuple{value.to(at::kBFloat16).to(at::kFloat), back_value, bits.value}}) {
    const at::Tensor range = x.amax(1) - x.amin(1);
    const at::Tensor half_step = range / ((1 << b) - 1) / 2;
    // fp16 scale and zero add their own rounding: 0.2% of the range.
    EXPECT_TRUE((x - y).abs().amax(1).le(half_step + 2e-3 * range + 1e-6).all().item<bool>())
        << "bits " << b << ": " << ((x - y).abs().amax(1) - half_step).max().item<double>();
  }
  EXPECT_TRUE(at::equal(back_value[4], at::full({head_dim}, 0.25)));
  // Key byte 0 of the token in slot 5 of page 1 is where the chunked layout puts it, and the
  // pages no token went to, and every slot nobody wrote, still hold the fill.
  const kv::leankv::PageSegments& s = f.segments(precision);
  const at::Tensor one = at::tensor(std::vector<int64_t>{1});
  const at::Tensor five = at::tensor(std::vector<int64_t>{5});
  at::Tensor single = at::full({4, f.page_bytes()}, 0xAB, at::kByte);
  leankv_write_tokens(single, f, precision, one, five, key.slice(0, 1, 2), value.slice(0, 1, 2),
                      acc.slice(0, 1, 2), position.slice(0, 1, 2));
  const at::Tensor changed = single.ne(0xAB).nonzero();
  EXPECT_TRUE(changed.select(1, 0).eq(1).all().item<bool>());  // page 1 only
  const at::Tensor offsets = changed.select(1, 1);
  const int64_t key_bytes = head_dim * bits.key / 8;
  for (int64_t o : std::vector<int64_t>(offsets.data_ptr<int64_t>(),
                                        offsets.data_ptr<int64_t>() + offsets.numel())) {
    const bool in_key = o >= s.key_data && o < s.key_params &&
                        (o - s.key_data) % (tokens * s.key_chunk) / s.key_chunk == 5;
    const bool in_value = o >= s.value_data && o < s.value_params &&
                          (o - s.value_data) % (tokens * s.value_chunk) / s.value_chunk == 5;
    const bool in_row =
        (o >= s.key_params && o < s.value_data) || (o >= s.value_params && o < s.end);
    EXPECT_TRUE(in_key || in_value || in_row) << "offset " << o;
    if (in_row) {
      const int64_t seg = o < s.value_data  ? s.key_params
                          : o < s.scores    ? s.value_params
                          : o < s.positions ? s.scores
                                            : s.positions;
      EXPECT_EQ((o - seg) / 4, 5) << "offset " << o;
    }
  }
  EXPECT_LE(offsets.numel(), key_bytes + head_dim * bits.value / 8 + 16);
  EXPECT_TRUE(at::equal(pool[0], before[0]));
  EXPECT_TRUE(at::equal(pool[2], before[2]));
}

INSTANTIATE_TEST_SUITE_P(Grid, LeanKvTokensTest,
                         ::testing::Combine(::testing::Values<int64_t>(64, 128),
                                            ::testing::Values(Precision::kHigh, Precision::kLow)),
                         [](const auto& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == Precision::kHigh ? "_high" : "_low");
                         });

TEST(LeanKvOps, PromptScoresAreColumnSumsOfLaterQueriesMaxOverTheGroup) {
  at::manual_seed(5);
  const int64_t n = 300, heads = 6, kv_heads = 2, d = 16;  // 300 > one 256-row chunk
  const at::Tensor q = at::randn({n, heads, d});
  const at::Tensor k = at::randn({n, kv_heads, d});
  const double scale = 0.25;
  const at::Tensor acc = leankv_prompt_scores(q, k, scale);
  ASSERT_EQ(acc.sizes(), (std::vector<int64_t>{kv_heads, n}));
  const at::Tensor causal = at::ones({n, n}, at::kBool).tril();
  at::Tensor expected = at::zeros({kv_heads, n});
  for (int64_t g = 0; g < heads; ++g) {
    const int64_t h = g / (heads / kv_heads);
    const at::Tensor logits = at::matmul(q.select(1, g), k.select(1, h).t()) * scale;
    const at::Tensor a = at::softmax(logits.masked_fill(causal.logical_not(), -INFINITY), -1);
    const at::Tensor received = a.tril(-1).sum(0);  // from queries j > p only
    expected[h] = at::maximum(expected[h], received);
  }
  EXPECT_TRUE(at::allclose(acc, expected, 1e-5, 1e-5))
      << (acc - expected).abs().max().item<double>();
  EXPECT_EQ(acc[0][n - 1].item<float>(), 0.0f);
}

// Two sequences, 2 KV heads each with 2 query heads: entry 2s+h. Entry 0 holds 40 high tokens
// (two pages) and 70 low ones (two pages); the others fewer, one none at all.
// A decode attention with leankv_decode_attention's contract: libtorch's (leankv_ops.h) or
// Strata's CPU loop (cpu_ops.h).
using DecodeAttention = at::Tensor (*)(const at::Tensor&, at::Tensor&, const PageFormat&,
                                       const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&, const at::Tensor&, at::Tensor&, double);

class LeanKvDecodeTest : public ::testing::TestWithParam<DecodeAttention> {};

TEST_P(LeanKvDecodeTest, MatchesSoftmaxOverDequantizedTokensAndTheWindow) {
  const DecodeAttention leankv_decode_attention = GetParam();
  const PageFormat f = format_of(64);
  const int64_t d = 64, width = 6, window_capacity = 8;
  at::manual_seed(9);
  at::Tensor pool = at::zeros({12, f.page_bytes()}, at::kByte);
  at::Tensor tables = at::full({4, width}, -1, at::kInt);
  const std::vector<std::tuple<int64_t, int64_t>> counts = {{40, 70}, {5, 0}, {0, 0}, {33, 1}};
  int32_t next_page = 0;
  for (int64_t e = 0; e < 4; ++e) {
    const auto [high, low] = counts[e];
    for (int64_t i = 0; i < (high + 31) / 32; ++i) tables[e][i] = next_page++;
    for (int64_t j = 0; j < (low + 55) / 56; ++j) tables[e][width - 1 - j] = next_page++;
  }
  at::Tensor token_counts = at::zeros({4, 2}, at::kInt);
  for (int64_t e = 0; e < 4; ++e) {
    token_counts[e][0] = std::get<0>(counts[e]);
    token_counts[e][1] = std::get<1>(counts[e]);
    for (Precision p : {Precision::kHigh, Precision::kLow}) {
      const auto [page, slot] =
          leankv_token_slots(f, p, tables, token_counts, at::full({1}, e, at::kLong));
      const int64_t m = page.size(0);
      leankv_write_tokens(pool, f, p, page, slot, at::randn({m, d}), at::randn({m, d}),
                          at::rand({m}), at::arange(m, at::kInt));
    }
  }
  // Entry 0's tokens: high ones fill pages 0 and 1 (32 + 8), low ones page 2 (at the right
  // end of the table, 56 tokens) then page 3.
  const auto [high_page, high_slot] =
      leankv_token_slots(f, Precision::kHigh, tables, token_counts, at::full({1}, 0, at::kLong));
  EXPECT_TRUE(
      at::equal(high_page, at::cat({at::zeros({32}, at::kLong), at::ones({8}, at::kLong)})));
  EXPECT_TRUE(at::equal(high_slot, at::cat({at::arange(32), at::arange(8)})));
  const auto [low_page, low_slot] =
      leankv_token_slots(f, Precision::kLow, tables, token_counts, at::full({1}, 0, at::kLong));
  EXPECT_TRUE(
      at::equal(low_page, at::cat({at::full({56}, 2, at::kLong), at::full({14}, 3, at::kLong)})));
  EXPECT_TRUE(at::equal(low_slot, at::cat({at::arange(56), at::arange(14)})));
  // Several entries at once: their tokens entry after entry, in the order given.
  for (Precision p : {Precision::kHigh, Precision::kLow}) {
    const auto [pages, slots] =
        leankv_token_slots(f, p, tables, token_counts, at::tensor(std::vector<int64_t>{3, 0, 2}));
    std::vector<at::Tensor> want_pages, want_slots;
    for (int64_t e : {3, 0, 2}) {
      const auto [page, slot] =
          leankv_token_slots(f, p, tables, token_counts, at::full({1}, e, at::kLong));
      want_pages.push_back(page);
      want_slots.push_back(slot);
    }
    EXPECT_TRUE(at::equal(pages, at::cat(want_pages)));
    EXPECT_TRUE(at::equal(slots, at::cat(want_slots)));
  }
  const at::Tensor q = at::randn({2, 4, d});
  const at::Tensor window = at::randn({2, 2, 2, window_capacity, d});
  const at::Tensor window_lens = at::tensor(std::vector<int32_t>{8, 3});
  at::Tensor window_acc = at::rand({2, 2, window_capacity});
  const at::Tensor entries = at::tensor(std::vector<int32_t>{0, 1, 2, 3}).view({2, 2});
  const at::Tensor pool_before = pool.clone(), window_acc_before = window_acc.clone();
  const double scale = 0.125;
  const at::Tensor out = leankv_decode_attention(q, pool, f, tables, token_counts, entries, window,
                                                 window_lens, window_acc, scale);
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t e = entries[s][h].item<int64_t>(), wl = window_lens[s].item<int64_t>();
      std::vector<at::Tensor> keys, values, before, after;
      for (Precision p : {Precision::kHigh, Precision::kLow}) {
        const auto [page, slot] =
            leankv_token_slots(f, p, tables, token_counts, at::full({1}, e, at::kLong));
        const auto [old_key, old_value, old_acc, old_position] =
            leankv_read_tokens(pool_before, f, p, page, slot);
        keys.push_back(old_key);
        values.push_back(old_value);
        before.push_back(old_acc);
        after.push_back(std::get<2>(leankv_read_tokens(pool, f, p, page, slot)));
      }
      keys.push_back(window[s][0][h].slice(0, 0, wl));
      values.push_back(window[s][1][h].slice(0, 0, wl));
      before.push_back(window_acc_before[s][h].slice(0, 0, wl));
      after.push_back(window_acc[s][h].slice(0, 0, wl));
      const at::Tensor qg = q[s].slice(0, 2 * h, 2 * h + 2);
      const at::Tensor p = at::softmax(at::matmul(qg, at::cat(keys).t()) * scale, -1);
      EXPECT_TRUE(at::allclose(out[s].slice(0, 2 * h, 2 * h + 2), at::matmul(p, at::cat(values)),
                               1e-5, 1e-5));
      const at::Tensor added = at::cat(after) - at::cat(before);
      EXPECT_TRUE(at::allclose(added, std::get<0>(p.max(0)), 1e-6, 1e-6));
      // Each query head's probabilities sum to 1; the max over two heads adds between 1 and 2.
      const double total = added.sum().item<double>();
      EXPECT_GE(total, 1.0 - 1e-5);
      EXPECT_LE(total, 2.0 + 1e-5);
    }
  }
  // Nothing but the scores segments changed in the pool.
  const kv::leankv::PageSegments& hs = f.segments(Precision::kHigh);
  EXPECT_TRUE(at::equal(pool.slice(1, 0, hs.scores).slice(0, 0, 2),
                        pool_before.slice(1, 0, hs.scores).slice(0, 0, 2)));
}

INSTANTIATE_TEST_SUITE_P(Implementations, LeanKvDecodeTest,
                         ::testing::Values(&aten::leankv_decode_attention,
                                           &cpu::leankv_decode_attention),
                         [](const auto& info) { return info.index == 0 ? "aten" : "cpu_loop"; });

// The CPU loops against libtorch's over page formats, head dims, groups and dtypes: the decode
// attention's output, the window's accumulators and every byte of the pool (the pages'
// accumulators within float rounding, the rest exactly), then the decode step's plan (exactly).
TEST(LeanKvOps, CpuLoopDecodesLikeLibtorch) {
  for (const auto& [high, low, d, group, dtype] :
       {std::tuple{PrecisionBits{8, 4}, PrecisionBits{4, 2}, int64_t{64}, int64_t{3}, at::kFloat},
        std::tuple{PrecisionBits{8, 8}, PrecisionBits{2, 2}, int64_t{128}, int64_t{1},
                   at::kBFloat16},
        std::tuple{PrecisionBits{4, 4}, PrecisionBits{2, 4}, int64_t{64}, int64_t{4}, at::kHalf}}) {
    SCOPED_TRACE("d " + std::to_string(d) + " group " + std::to_string(group));
    const PageFormat f = PageFormat::create(d, high, low, 16).value();
    const int64_t width = 8, capacity = 6, kv_heads = 2, seqs = 3, entries_n = seqs * kv_heads;
    at::manual_seed(d + group);
    at::Tensor pool = at::zeros({40, f.page_bytes()}, at::kByte);
    at::Tensor tables = at::full({entries_n, width}, -1, at::kInt);
    at::Tensor token_counts = at::zeros({entries_n, 2}, at::kInt);
    const int32_t th = f.tokens_per_page(Precision::kHigh), tl = f.tokens_per_page(Precision::kLow);
    int32_t next_page = 0;
    for (int64_t e = 0; e < entries_n; ++e) {
      const int64_t counts[2] = {(e * 7) % 40, (e * 13) % (2 * tl + 3)};
      for (int64_t i = 0; i < (counts[0] + th - 1) / th; ++i) tables[e][i] = next_page++;
      for (int64_t j = 0; j < (counts[1] + tl - 1) / tl; ++j)
        tables[e][width - 1 - j] = next_page++;
      token_counts[e][0] = counts[0];
      token_counts[e][1] = counts[1];
      for (Precision p : {Precision::kHigh, Precision::kLow}) {
        const auto [page, slot] =
            leankv_token_slots(f, p, tables, token_counts, at::full({1}, e, at::kLong));
        const int64_t m = page.size(0);
        leankv_write_tokens(pool, f, p, page, slot, at::randn({m, d}) * 2, at::randn({m, d}),
                            at::rand({m}), at::arange(m, at::kInt));
      }
    }
    const at::Tensor q = at::randn({seqs, kv_heads * group, d}).to(dtype);
    const at::Tensor window = at::randn({seqs, 2, kv_heads, capacity, d}).to(dtype);
    const at::Tensor window_lens = at::tensor(std::vector<int32_t>{6, 1, 4});
    const at::Tensor entries = at::tensor(std::vector<int32_t>{5, 0, 2, 3, 1, 4}).view({3, 2});
    const at::Tensor window_acc0 = at::rand({seqs, kv_heads, capacity});
    at::Tensor ref_pool = pool.clone(), ref_acc = window_acc0.clone();
    at::Tensor cpu_pool = pool.clone(), cpu_acc = window_acc0.clone();
    const at::Tensor ref = aten::leankv_decode_attention(
        q, ref_pool, f, tables, token_counts, entries, window, window_lens, ref_acc, 0.1);
    const at::Tensor ours = cpu::leankv_decode_attention(
        q, cpu_pool, f, tables, token_counts, entries, window, window_lens, cpu_acc, 0.1);
    ASSERT_EQ(ours.scalar_type(), dtype);
    const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
    EXPECT_TRUE(at::allclose(ours.to(at::kFloat), ref.to(at::kFloat), tol, tol))
        << "max diff " << (ours.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>();
    EXPECT_TRUE(at::allclose(cpu_acc, ref_acc, 1e-5, 1e-6));
    for (Precision p : {Precision::kHigh, Precision::kLow}) {
      const auto [page, slot] =
          leankv_token_slots(f, p, tables, token_counts, at::arange(entries_n, at::kLong));
      const at::Tensor got = std::get<2>(leankv_read_tokens(cpu_pool, f, p, page, slot));
      const at::Tensor want = std::get<2>(leankv_read_tokens(ref_pool, f, p, page, slot));
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "accumulators of the pages";
      EXPECT_GT((got - std::get<2>(leankv_read_tokens(pool, f, p, page, slot)))
                    .abs()
                    .sum()
                    .item<double>(),
                0.0)
          << "the accumulators grew";
    }
    for (Precision p : {Precision::kHigh, Precision::kLow}) {  // the scores aside, bytes equal
      const kv::leankv::PageSegments& seg = f.segments(p);
      for (at::Tensor* x : {&cpu_pool, &ref_pool}) {
        x->narrow(1, seg.scores, 4 * seg.tokens).zero_();
      }
    }
    EXPECT_TRUE(at::equal(cpu_pool, ref_pool));

    // The decode step's plan from the pages' accumulators (as written): the same actions and
    // amounts at thresholds swept finely across the scores (1% apart), so a score off by more than
    // that changes some decision.
    const at::Tensor all = at::arange(entries_n, at::kInt);
    const at::Tensor lengths = token_counts.sum(1).to(at::kLong) + 40;
    const at::Tensor candidate = at::rand({entries_n}) / 30;
    int64_t victims = 0;
    for (double alpha_low = 1e-3; alpha_low < 30; alpha_low *= 1.01) {
      const kv::leankv::Thresholds thresholds{4 * alpha_low, alpha_low,
                                              static_cast<int32_t>(capacity)};
      const auto [want_actions, want_amounts] = aten::leankv_settle_plan(
          pool, f, tables, token_counts, all, lengths, candidate, thresholds);
      const auto [actions, amounts] = cpu::leankv_settle_plan(pool, f, tables, token_counts, all,
                                                              lengths, candidate, thresholds);
      ASSERT_TRUE(at::equal(actions, want_actions)) << "alpha_low " << alpha_low;
      ASSERT_TRUE(at::equal(amounts, want_amounts)) << "alpha_low " << alpha_low;
      victims += want_actions.select(1, 1).ge(0).sum().item<int64_t>();
    }
    EXPECT_GT(victims, 0) << "no victim chosen";
  }
}

}  // namespace
}  // namespace strata::kernels::aten
