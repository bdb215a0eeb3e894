// One KV pool holding pages of several formats (kv/page_layout.h, the executor's KvPool) on the
// real model:
// - a sequence in the base format gives exactly the logits of a pool without other formats, with
//   its neighbour in the batch on quantized pages;
// - layers on quantized pages (written by re-quantizing their blocks, read dequantized: the page
//   formats' libtorch reference) stay close to the base run, closer the more bits they keep;
// - a sequence's logits do not depend on the formats of the sequences batched with it;
// - layers that share another layer's blocks never write them;
// - forward() refuses layouts that do not fit the pool or the page tables.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "logit_checks.h"
#include "paged_runner.h"
#include "strata/executor/executor.h"
#include "strata/model/model_source.h"

namespace strata::executor {
namespace {

using testing::max_abs_diff;
using testing::same_argmax;

using kv::Grouping;
using kv::KvFormat;
using kv::KvLayout;
using kv::TensorFormat;

constexpr int kLayers = 30;  // SmolLM2-135M
constexpr int kSteps = 6;    // the prompt, then greedy decode steps

KvFormat symmetric(DType dtype, int group) {
  const TensorFormat t{dtype, Grouping::kPerToken, group};
  return {t, t};
}
const KvFormat kBf16 = KvFormat::plain(DType::kBFloat16);
const KvFormat kInt8 = symmetric(DType::kInt8, 64);
const KvFormat kK8V4{{DType::kInt8, Grouping::kPerToken, 64},
                     {DType::kInt4, Grouping::kPerToken, 64}};
const KvFormat kInt4 = symmetric(DType::kInt4, 32);
const KvFormat kInt2 = symmetric(DType::kInt2, 32);
const KvFormat kFp8 = symmetric(DType::kFloat8E4M3, 64);
const KvFormat kInt4Channel{{DType::kInt4, Grouping::kPerChannel, 0},
                            {DType::kInt4, Grouping::kPerToken, 32}};

KvLayout every_layer(const KvFormat& f) { return {std::vector<KvFormat>(kLayers, f), {}}; }

class ExecutorFormatTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    StatusOr<std::unique_ptr<model::ModelSource>> source =
        model::open_model_source(STRATA_TEST_MODEL);
    ASSERT_TRUE(source.ok()) << source.status().to_string();
    source_ = std::move(source).value().release();
  }
  static void TearDownTestSuite() { delete source_; }

  static std::unique_ptr<Executor> make(std::vector<KvFormat> formats,
                                        std::vector<int32_t> head_groups = {},
                                        DType dtype = DType::kFloat32) {
    ExecutorOptions options;
    options.dtype = dtype;
    options.kv_formats = std::move(formats);
    options.kv_head_groups = std::move(head_groups);
    // One-head int4 blocks of an fp32 pool: 76 to a page of 4 base blocks, past the 64 a page
    // holds; pages of 2 base blocks hold 38.
    if (!options.kv_head_groups.empty()) options.page_blocks = 2;
    StatusOr<std::unique_ptr<Executor>> executor = Executor::create(*source_, options);
    EXPECT_TRUE(executor.ok()) << executor.status().to_string();
    return executor.ok() ? std::move(executor).value() : nullptr;
  }

  static std::vector<TokenId> prompt(int n, int seed) {
    std::vector<TokenId> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<TokenId>(100 + (i * 7919 + seed) % 20000));
    return p;
  }

  // Each sequence's last-position logits per step: its prompt, then the tokens of `forced` (one a
  // step), all sequences in the same passes.
  struct Seq {
    SeqId id;
    std::vector<TokenId> prompt;
    KvLayout layout;
  };
  static std::vector<std::vector<std::vector<float>>> run(Executor& executor,
                                                          const std::vector<Seq>& seqs) {
    testing::PagedRunner runner(executor);
    std::vector<std::vector<std::vector<float>>> logits(seqs.size());
    for (int step = 0; step < kSteps; ++step) {
      std::vector<testing::PagedRunner::Step> steps;
      for (const Seq& s : seqs) {
        steps.push_back({s.id, step == 0 ? s.prompt : std::vector<TokenId>{forced(step)},
                         LogitsMode::kLast, s.layout});
      }
      StatusOr<ForwardResult> out = runner.run(steps);
      EXPECT_TRUE(out.ok()) << out.status().to_string();
      if (!out.ok()) return logits;
      const int64_t vocab = out->vocab_size;
      for (size_t i = 0; i < seqs.size(); ++i) {
        logits[i].emplace_back(out->logits.begin() + i * vocab,
                               out->logits.begin() + (i + 1) * vocab);
      }
    }
    return logits;
  }
  static TokenId forced(int step) { return static_cast<TokenId>(300 + 37 * step); }


  static model::ModelSource* source_;
};

model::ModelSource* ExecutorFormatTest::source_ = nullptr;

TEST_F(ExecutorFormatTest, BaseSequencesGiveTodaysLogitsBesideQuantizedPages) {
  // float32 pages (the CPU's default) and bfloat16 pages (the GPU's) alike.
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::unique_ptr<Executor> plain = make({}, {}, dtype);
    std::unique_ptr<Executor> mixed = make({kInt4, kK8V4}, {}, dtype);
    ASSERT_TRUE(plain && mixed);
    EXPECT_EQ(plain->kv_geometry().page_blocks, 1);
    EXPECT_EQ(mixed->kv_geometry().page_blocks, 4) << "base blocks are found through pages";
    const auto today = run(*plain, {{SeqId{1}, prompt(70, 1), {}}, {SeqId{2}, prompt(40, 2), {}}});
    const auto paged = run(
        *mixed, {{SeqId{1}, prompt(70, 1), {}}, {SeqId{2}, prompt(40, 2), every_layer(kInt4)}});
    EXPECT_EQ(paged[0], today[0]) << "bit for bit";
    EXPECT_GT(max_abs_diff(paged[1], today[1]), 0) << "the neighbour really is on int4 pages";
  }
}

TEST_F(ExecutorFormatTest, QuantizedLayersStayCloseInOrderOfTheirBits) {
  const std::vector<KvFormat> formats = {kBf16, kFp8, kInt8, kK8V4, kInt4, kInt4Channel, kInt2};
  std::unique_ptr<Executor> executor = make(formats);
  ASSERT_TRUE(executor);
  const std::vector<TokenId> p = prompt(90, 3);
  const auto base = run(*executor, {{SeqId{1}, p, {}}})[0];
  std::vector<double> error;
  for (size_t f = 0; f < formats.size(); ++f) {
    const auto ours = run(*executor, {{SeqId{1}, p, every_layer(formats[f])}})[0];
    error.push_back(max_abs_diff(ours, base));
    std::printf("%-40s max |logit diff| %.4f\n", kv::format_name(formats[f]).c_str(), error.back());
  }
  // Measured (max |logit diff| over 6 steps): bf16 0.05, int8 0.25, fp8 0.59, K8V4 1.28, int4
  // with per-channel keys 1.81, int4 3.07, int2 8.76. Each drops mantissa or integer bits.
  EXPECT_LT(error[0], error[2]) << "bf16 < int8";
  EXPECT_LT(error[2], error[1]) << "int8 < fp8 (3 mantissa bits)";
  EXPECT_LT(error[1], error[3]) << "fp8 < K8V4";
  EXPECT_LT(error[3], error[4]) << "K8V4 < int4";
  EXPECT_LT(error[5], error[4]) << "per-channel int4 keys < per-token ones (KIVI)";
  EXPECT_LT(error[4], error[6]) << "int4 < int2";
  EXPECT_LT(error[0], 0.1);
  EXPECT_LT(error[2], 0.5);
  EXPECT_GT(error[6], 4.0) << "int2 everywhere must hurt";
}

// Batching changes a sequence's float rounding a little (matmuls of other row counts: ~1e-5 in
// the logits with plain pages); int4 pages can turn such a difference into a flipped code and
// later steps differ by more. Reading a neighbour's blocks or format would put the result as far
// from the sequence alone as its own quantization error, or farther.
TEST_F(ExecutorFormatTest, ASequenceDoesNotDependOnItsNeighboursFormats) {
  std::unique_ptr<Executor> executor = make({kInt8, kInt4});
  ASSERT_TRUE(executor);
  const auto alone = run(*executor, {{SeqId{1}, prompt(50, 4), every_layer(kInt4)}})[0];
  const auto batched = run(*executor, {{SeqId{1}, prompt(50, 4), every_layer(kInt4)},
                                       {SeqId{2}, prompt(33, 5), every_layer(kInt8)},
                                       {SeqId{3}, prompt(20, 6), {}}});
  const auto unquantized = run(*executor, {{SeqId{1}, prompt(50, 4), {}}})[0];
  EXPECT_LT(max_abs_diff({batched[0][0]}, {alone[0]}), 1e-3);  // the prompt step
  EXPECT_LT(max_abs_diff(batched[0], alone), 0.25 * max_abs_diff(alone, unquantized));
}

TEST_F(ExecutorFormatTest, SharingLayersNeverWriteTheirOwnersBlocks) {
  std::unique_ptr<Executor> executor = make({kInt8});
  ASSERT_TRUE(executor);
  for (const KvFormat& format : {KvFormat::plain(DType::kFloat32), kInt8}) {
    // Odd layers read the even layer below them.
    KvLayout layout = every_layer(format);
    layout.shared_with.assign(kLayers, -1);
    for (int l = 1; l < kLayers; l += 2) layout.shared_with[l] = l - 1;
    if (format == KvFormat::plain(DType::kFloat32)) layout.formats.clear();
    const std::vector<TokenId> p = prompt(41, 7);
    // One pass computes every layer's attention before any later write could land; in two
    // passes the second reads what the first left in the shared blocks.
    testing::PagedRunner one(*executor), two(*executor);
    StatusOr<ForwardResult> whole = one.run({{SeqId{1}, p, LogitsMode::kLast, layout}});
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    ASSERT_TRUE(two.run({{SeqId{1}, {p.begin(), p.end() - 1}, LogitsMode::kNone, layout}}).ok());
    StatusOr<ForwardResult> split = two.run({{SeqId{1}, {p.back()}, LogitsMode::kLast, layout}});
    ASSERT_TRUE(split.ok()) << split.status().to_string();
    // Float rounding of the batch shapes is all that differs; on int8 pages a rounding can move a
    // value to the next code. A shared block overwritten by its sharer moves the logits by ~20.
    const double tolerance = format == kInt8 ? 0.5 : 1e-2;
    EXPECT_LT(max_abs_diff({whole->logits}, {split->logits}), tolerance) << kv::format_name(format);
    EXPECT_EQ(one.kv().used_bytes(), two.kv().used_bytes());
    EXPECT_EQ(one.kv().tables(SeqId{1})[1], one.kv().tables(SeqId{1})[0]);
  }
}

// Per-KV-head tables (SmolLM2 has 3 KV heads: a table and one-head blocks each): in the base format
// they hold the same values as whole-layer blocks; heads may take different formats.
TEST_F(ExecutorFormatTest, PerHeadTablesHoldEachHeadInItsOwnFormat) {
  std::unique_ptr<Executor> executor = make({kInt8, kInt4}, {3});
  ASSERT_TRUE(executor);
  const std::vector<TokenId> p = prompt(45, 9);
  const auto base = run(*executor, {{SeqId{1}, p, {}}})[0];
  KvLayout per_head{{}, {}, 3};
  EXPECT_LT(max_abs_diff(run(*executor, {{SeqId{1}, p, per_head}})[0], base), 1e-4)
      << "one-head fp32 blocks are the same values";
  auto heads = [&](const KvFormat& first, const KvFormat& rest) {
    KvLayout l{{}, {}, 3};
    for (int layer = 0; layer < kLayers; ++layer) {
      l.formats.insert(l.formats.end(), {first, rest, rest});
    }
    return max_abs_diff(run(*executor, {{SeqId{1}, p, l}})[0], base);
  };
  const double int8 = heads(kInt8, kInt8);
  const double mixed = heads(kInt8, kInt4);
  const double int4 = heads(kInt4, kInt4);
  std::printf(
      "per-head max |logit diff|: int8 %.4f, head 0 int8 + heads 1-2 int4 %.4f, int4 %.4f\n", int8,
      mixed, int4);
  EXPECT_LT(int8, mixed) << "heads 1 and 2 lose bits";
  EXPECT_LT(mixed, int4) << "head 0 keeps them";
  // Batched beside whole-layer sequences of other formats.
  const auto batched = run(*executor, {{SeqId{1}, p, per_head},
                                       {SeqId{2}, prompt(30, 10), every_layer(kInt4)},
                                       {SeqId{3}, prompt(20, 11), {}}});
  EXPECT_LT(max_abs_diff(batched[0], base), 1e-3);
}

TEST_F(ExecutorFormatTest, ForwardRefusesLayoutsThatDoNotFit) {
  std::unique_ptr<Executor> executor = make({kInt8});
  ASSERT_TRUE(executor);
  testing::PagedRunner runner(*executor);
  ASSERT_TRUE(runner.run({{SeqId{1}, prompt(20, 8), LogitsMode::kLast, every_layer(kInt8)}}).ok());
  const auto& tables = runner.kv().tables(SeqId{1});
  ForwardBatch batch;
  const KvLayout foreign = every_layer(kInt4);  // a format the pool was not built for
  batch.chunks.push_back({SeqId{1}, {5}, 20, tables, LogitsMode::kLast, &foreign});
  StatusOr<ForwardResult> out = executor->forward(batch);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("not in the pool"), std::string::npos)
      << out.status().to_string();
  KvLayout shared = every_layer(kInt8);
  shared.shared_with.assign(kLayers, -1);
  shared.shared_with[3] = 2;  // but table 3 is layer 3's own
  batch.chunks[0].layout = &shared;
  out = executor->forward(batch);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("layer 3 shares"), std::string::npos)
      << out.status().to_string();
}

}  // namespace
}  // namespace strata::executor
