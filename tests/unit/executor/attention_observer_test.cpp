// Krul's attention observer (src/executor/attention_observer.h): the device accumulators a CUDA
// engine keeps for decode rows (kernels::krul_accumulate_rows, folded into the statistics at
// take) give the statistics of the host path (krul_accumulate into float64), over a prompt chunk
// and decode steps of growing length, for two sequences at once; a sequence restarted at
// position 0 starts over. Observing every third row (kv_store.krul_row_stride) over prompt chunks
// and decode steps gives the statistics of those rows reduced one at a time.
#include "attention_observer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

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
  AttentionObserver host(kLayers, kHeads), device(kLayers, kHeads, /*device_accumulators=*/true);
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
    EXPECT_FALSE(device.take(seq)) << "taken statistics are forgotten";
  }
  // A chunk at position 0 starts the statistics over: a second turn equals a fresh one.
  AttentionObserver again(kLayers, kHeads, true), fresh(kLayers, kHeads, true);
  run_turn(again, SeqId{3}, 4, 9);
  run_turn(again, SeqId{3}, 2, 10);
  run_turn(fresh, SeqId{3}, 2, 10);
  EXPECT_EQ(again.take(SeqId{3})->squared, fresh.take(SeqId{3})->squared);
}

TEST(AttentionObserverTest, StridedRowsGiveTheStatisticsOfThoseRows) {
  constexpr int64_t kStride = 3, kTotal = 21;
  at::manual_seed(11);
  const at::Tensor q = at::randn({kLayers, kTotal, kHeads, kDim});
  const at::Tensor k = at::randn({kLayers, kTotal, kKvHeads, kDim});
  AttentionObserver observer(kLayers, kHeads);
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
  kv::krul::AttentionStats want(kLayers, kHeads);
  for (int64_t p = 0; p < kTotal; p += kStride) {
    std::vector<at::Tensor> rows;
    for (int64_t l = 0; l < kLayers; ++l) {
      rows.push_back(kernels::aten::krul_attention_rows(q[l].slice(0, p, p + 1),
                                                        k[l].slice(0, 0, p + 1), p, 0.35));
    }
    kernels::aten::krul_accumulate(at::stack(rows), at::full({1}, p + 1, at::kLong), want);
  }
  const std::optional<kv::krul::AttentionStats> got = observer.take(SeqId{1});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->observed, want.observed);
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_NEAR(got->edge_mass[l], want.edge_mass[l], 1e-5 * want.edge_mass[l]) << "layer " << l;
  }
  for (size_t i = 0; i < want.squared.size(); ++i) {
    EXPECT_NEAR(got->squared[i], want.squared[i], 1e-5 * std::abs(want.squared[i]) + 1e-9) << i;
  }
}

}  // namespace
}  // namespace strata::executor
