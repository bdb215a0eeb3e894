// Krul's attention observer (src/executor/attention_observer.h): the device accumulators a CUDA
// engine keeps for decode rows (kernels::krul_accumulate_rows, folded into the statistics at
// take) give the statistics of the host path (krul_accumulate into float64), over a prompt chunk
// and decode steps of growing length, for two sequences at once; a sequence restarted at
// position 0 starts over. Observing every third row (kv_store.krul_row_stride) over prompt chunks
// and decode steps gives the statistics of those rows reduced one at a time. Prompt rows are
// reduced by the reducer's thread while no call is made (take finds nothing left), and a turn
// forgotten or started over while its rows are queued leaves nothing of them behind; a reduction
// that fails on the thread fails take(), on the caller's thread, and the process goes on. The
// attention each token received (H2O's score) equals a sum over whole causal attention matrices.
#include "attention_observer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "strata/kernels/krul_ops.h"

namespace strata::executor {
namespace {

constexpr int32_t kLayers = 4, kHeads = 6, kKvHeads = 2;
constexpr int64_t kDim = 8;

// One sequence's turn: a 12-token prompt chunk, then `steps` decode steps, through `observer`.
void run_turn(AttentionObserver& observer, SeqId seq, int64_t steps, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t prompt = 12, total = prompt + steps;
  const at::Tensor q = at::randn({kLayers, total, kHeads, kDim});
  const at::Tensor k = at::randn({kLayers, total, kKvHeads, kDim});
  for (int64_t l = 0; l < kLayers; ++l) {
    observer.observe(seq, l, q[l].narrow(0, 0, prompt), k[l].narrow(0, 0, prompt), 0, 0.35, 1);
  }
  observer.after_pass(kernels::KernelBackend::kStrata);
  for (int64_t t = prompt; t < total; ++t) {
    for (int64_t l = 0; l < kLayers; ++l) {
      observer.observe(seq, l, q[l].narrow(0, t, 1), k[l].narrow(0, 0, t + 1), t, 0.35, 1);
    }
    observer.after_pass(kernels::KernelBackend::kStrata);
  }
}

TEST(AttentionObserverTest, DeviceAccumulatorsGiveTheHostPathsStatistics) {
  AttentionObserver host(kLayers, kHeads, kKvHeads),
      device(kLayers, kHeads, kKvHeads, /*device_accumulators=*/true);
  for (AttentionObserver* o : {&host, &device}) {
    run_turn(*o, SeqId{1}, 5, 7);
    run_turn(*o, SeqId{2}, 3, 8);
  }
  for (SeqId seq : {SeqId{1}, SeqId{2}}) {
    const std::optional<kv::krul::AttentionStats> want = host.take(seq);
    const std::optional<kv::krul::AttentionStats> got = device.take(seq);
    ASSERT_TRUE(want && got);
    EXPECT_EQ(got->observed, want->observed);
    for (int32_t l = 0; l < kLayers; ++l) {
      EXPECT_NEAR(got->edge_mass[l], want->edge_mass[l], 1e-5 * want->edge_mass[l])
          << "layer " << l;
    }
    double largest = 0;
    for (size_t i = 0; i < want->squared.size(); ++i) {
      EXPECT_NEAR(got->squared[i], want->squared[i], 1e-5 * std::abs(want->squared[i]) + 1e-9) << i;
      largest = std::max(largest, want->squared[i]);
    }
    EXPECT_GT(largest, 0.0);
    ASSERT_EQ(got->token_mass.size(), want->token_mass.size());
    for (size_t i = 0; i < want->token_mass.size(); ++i) {
      EXPECT_NEAR(got->token_mass[i], want->token_mass[i], 1e-5) << i;
    }
    EXPECT_FALSE(device.take(seq)) << "taken statistics are forgotten";
  }
  // Built without KV heads (no H2O codec) an observer keeps no token mass, and the same rest.
  for (const bool device : {false, true}) {
    AttentionObserver with(kLayers, kHeads, kKvHeads, device), without(kLayers, kHeads, 0, device);
    run_turn(with, SeqId{4}, 3, 12);
    run_turn(without, SeqId{4}, 3, 12);
    const std::optional<kv::krul::AttentionStats> a = with.take(SeqId{4}),
                                                  b = without.take(SeqId{4});
    ASSERT_TRUE(a && b);
    EXPECT_FALSE(a->token_mass.empty());
    EXPECT_TRUE(b->token_mass.empty());
    EXPECT_EQ(a->squared, b->squared);
  }
  // A chunk at position 0 starts the statistics over: a second turn equals a fresh one.
  AttentionObserver again(kLayers, kHeads, kKvHeads, true), fresh(kLayers, kHeads, kKvHeads, true);
  run_turn(again, SeqId{3}, 4, 9);
  run_turn(again, SeqId{3}, 2, 10);
  run_turn(fresh, SeqId{3}, 2, 10);
  const std::vector<double> restarted = again.take(SeqId{3})->squared;
  const std::vector<double> first = fresh.take(SeqId{3})->squared;
  ASSERT_EQ(restarted.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_NEAR(restarted[i], first[i], 1e-9 * std::abs(first[i])) << i;
  }
}

// The statistics of the rows at positions 0, stride, 2 stride, ... < n, one row at a time (the
// reference).
kv::krul::AttentionStats rows_one_by_one(const at::Tensor& q, const at::Tensor& k, int64_t n,
                                         int64_t stride = 1) {
  kv::krul::AttentionStats want(kLayers, kHeads, kKvHeads);
  for (int64_t p = 0; p < n; p += stride) {
    std::vector<at::Tensor> rows;
    for (int64_t l = 0; l < kLayers; ++l) {
      rows.push_back(kernels::aten::krul_attention_rows(q[l].slice(0, p, p + 1),
                                                        k[l].slice(0, 0, p + 1), p, 0.35));
    }
    kernels::aten::krul_accumulate(at::stack(rows), at::full({1}, p + 1, at::kLong), want);
  }
  return want;
}

// `got` has the rows of `want`, and its sums within float tolerance.
void expect_stats_near(const std::optional<kv::krul::AttentionStats>& got,
                       const kv::krul::AttentionStats& want) {
  ASSERT_TRUE(got);
  EXPECT_EQ(got->observed, want.observed);
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_NEAR(got->edge_mass[l], want.edge_mass[l], 1e-5 * want.edge_mass[l]) << "layer " << l;
  }
  for (size_t i = 0; i < want.squared.size(); ++i) {
    EXPECT_NEAR(got->squared[i], want.squared[i], 1e-5 * std::abs(want.squared[i]) + 1e-9) << i;
  }
  ASSERT_EQ(got->token_mass.size(), want.token_mass.size());
  // Float32 sums of up to hundreds of rows, added in the order the reducer thread took them.
  for (size_t i = 0; i < want.token_mass.size(); ++i) {
    EXPECT_NEAR(got->token_mass[i], want.token_mass[i], 1e-5 * std::abs(want.token_mass[i]) + 1e-6)
        << i;
  }
}

// H2O's score straight from the whole causal attention matrices: [n, L, Hkv], each token's
// probability from the rows at multiples of `stride`, summed over them and a KV head's query
// heads.
at::Tensor received_attention(const at::Tensor& q, const at::Tensor& k, int64_t n, int64_t stride) {
  const int64_t group = kHeads / kKvHeads;
  std::vector<at::Tensor> layers;
  for (int64_t l = 0; l < kLayers; ++l) {
    const at::Tensor keys = k[l].narrow(0, 0, n).repeat_interleave(group, 1);  // [n, H, D]
    at::Tensor scores = at::einsum("phd,thd->hpt", {q[l].narrow(0, 0, n), keys}) * 0.35;
    scores = scores.masked_fill(at::ones({n, n}, at::kBool).triu(1), -INFINITY);
    const at::Tensor rows = at::softmax(scores, -1).slice(1, 0, n, stride);  // [H, rows, n]
    layers.push_back(rows.sum(1).view({kKvHeads, group, n}).sum(1));         // [Hkv, n]
  }
  return at::stack(layers).permute({2, 0, 1}).contiguous();
}

TEST(AttentionObserverTest, StridedRowsGiveTheStatisticsOfThoseRows) {
  constexpr int64_t kStride = 3, kTotal = 21;
  at::manual_seed(11);
  const at::Tensor q = at::randn({kLayers, kTotal, kHeads, kDim});
  const at::Tensor k = at::randn({kLayers, kTotal, kKvHeads, kDim});
  AttentionObserver observer(kLayers, kHeads, kKvHeads);
  // Prompt chunks [0, 7) (rows 0, 3, 6), [7, 8) (none), [8, 12) (row 9), then decode steps
  // 12-20 (rows 12, 15, 18): what the executor hands over (observes_rows).
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 7}, {7, 8}, {8, 12}};
  std::vector<std::pair<int64_t, int64_t>> passes = chunks;
  for (int64_t t = 12; t < kTotal; ++t) passes.emplace_back(t, t + 1);
  int64_t observed_passes = 0;
  for (const auto& [start, end] : passes) {
    if (!AttentionObserver::observes_rows(start, end - start, kStride)) continue;
    ++observed_passes;
    for (int64_t l = 0; l < kLayers; ++l) {
      observer.observe(SeqId{1}, l, q[l].slice(0, start, end), k[l].slice(0, 0, end), start, 0.35,
                       kStride);
    }
    observer.after_pass(kernels::KernelBackend::kStrata);
  }
  EXPECT_EQ(observed_passes, 5);
  const std::optional<kv::krul::AttentionStats> got = observer.take(SeqId{1});
  expect_stats_near(got, rows_one_by_one(q, k, kTotal, kStride));
  // The last observed row, at 18, reaches tokens [0, 19); tokens 19 and 20 received nothing.
  const at::Tensor want = received_attention(q, k, kTotal, kStride);
  EXPECT_EQ(want.narrow(0, 19, 2).abs().sum().item<float>(), 0.0F);
  ASSERT_EQ(got->tokens(), 19);
  const at::Tensor mass = at::from_blob(const_cast<float*>(got->token_mass.data()),
                                        {19, kLayers, kKvHeads}, at::kFloat);
  EXPECT_TRUE(at::allclose(mass, want.narrow(0, 0, 19), 1e-5, 1e-5))
      << (mass - want.narrow(0, 0, 19)).abs().max().item<float>();
  // Every observed row's probability is counted once: 7 rows, each summing to 1, per query head.
  EXPECT_NEAR(mass.sum().item<double>(), 7.0 * kLayers * kHeads, 1e-3);
}

// Whether the observer's pending prompt rows reach 0 within a minute, without a call to it.
bool drained(const AttentionObserver& observer) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (observer.pending_prompt_rows() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return observer.pending_prompt_rows() == 0;
}

TEST(AttentionObserverTest, PromptRowsAreReducedBesideThePasses) {
  constexpr int64_t kPrompt = 96;  // two chunks of 48: six blocks of 16 rows
  at::manual_seed(12);
  const at::Tensor q = at::randn({kLayers, kPrompt, kHeads, kDim});
  const at::Tensor k = at::randn({kLayers, kPrompt, kKvHeads, kDim});
  AttentionObserver observer(kLayers, kHeads, kKvHeads);
  for (int64_t start : {int64_t{0}, int64_t{48}}) {
    for (int64_t l = 0; l < kLayers; ++l) {
      observer.observe(SeqId{1}, l, q[l].slice(0, start, start + 48), k[l].slice(0, 0, start + 48),
                       start, 0.35, 1);
    }
    if (start == 0) {
      EXPECT_EQ(observer.pending_prompt_rows(), 0) << "handed over after the pass";
    }
    observer.after_pass(kernels::KernelBackend::kStrata);
  }
  // Nothing is called meanwhile: the reducer's thread reduces every row.
  EXPECT_TRUE(drained(observer)) << "the reducer's thread did not reduce the rows";
  expect_stats_near(observer.take(SeqId{1}), rows_one_by_one(q, k, kPrompt));
}

TEST(AttentionObserverTest, ForgottenOrRestartedTurnsLeaveNoQueuedRows) {
  constexpr int64_t kPrompt = 200, kChunk = 40;
  at::manual_seed(13);
  const at::Tensor q = at::randn({kLayers, kPrompt, kHeads, kDim});
  const at::Tensor k = at::randn({kLayers, kPrompt, kKvHeads, kDim});
  const auto observe_prompt = [&](AttentionObserver& o, SeqId seq, int64_t n) {
    for (int64_t start = 0; start < n; start += kChunk) {
      for (int64_t l = 0; l < kLayers; ++l) {
        o.observe(seq, l, q[l].slice(0, start, start + kChunk), k[l].slice(0, 0, start + kChunk),
                  start, 0.35, 1);
      }
      o.after_pass(kernels::KernelBackend::kStrata);
    }
  };
  AttentionObserver observer(kLayers, kHeads, kKvHeads);
  observe_prompt(observer, SeqId{1}, kPrompt);
  observe_prompt(observer, SeqId{2}, kPrompt);
  observer.forget(SeqId{1});
  EXPECT_FALSE(observer.take(SeqId{1}));
  // Sequence 2 starts over with a shorter prompt while its first one may still be queued: its
  // statistics are those of the second prompt alone.
  observe_prompt(observer, SeqId{2}, 2 * kChunk);
  expect_stats_near(observer.take(SeqId{2}), rows_one_by_one(q, k, 2 * kChunk));
  EXPECT_TRUE(drained(observer)) << "dropped rows stay pending";
}

TEST(AttentionObserverTest, AReductionThatFailsOnTheThreadFailsTake) {
  at::manual_seed(14);
  const at::Tensor q = at::randn({kLayers, 32, kHeads, kDim});
  const at::Tensor k = at::randn({kLayers, 32, kKvHeads, kDim});
  AttentionObserver observer(kLayers, kHeads, kKvHeads);
  for (int64_t l = 0; l < kLayers; ++l) {
    // Keys for 8 positions where the chunk's rows attend to 32: reducing them throws.
    observer.observe(SeqId{1}, l, q[l], k[l].narrow(0, 0, 8), 0, 0.35, 1);
  }
  observer.after_pass(kernels::KernelBackend::kStrata);
  // The thread takes the chunk up at once; give it the time to fail on it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(observer.pending_prompt_rows(), 32) << "a failed chunk is still pending";
  EXPECT_THROW(observer.take(SeqId{1}), c10::Error);
  EXPECT_FALSE(observer.take(SeqId{1})) << "a turn whose reduction failed is forgotten";
  // The thread goes on serving other turns.
  for (int64_t l = 0; l < kLayers; ++l) {
    observer.observe(SeqId{2}, l, q[l], k[l], 0, 0.35, 1);
  }
  observer.after_pass(kernels::KernelBackend::kStrata);
  EXPECT_TRUE(drained(observer));
  expect_stats_near(observer.take(SeqId{2}), rows_one_by_one(q, k, 32));
}

}  // namespace
}  // namespace strata::executor
