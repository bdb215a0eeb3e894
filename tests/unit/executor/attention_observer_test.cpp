// Krul's attention observer (src/executor/attention_observer.h): the device accumulators a CUDA
// engine keeps for decode rows (kernels::krul_accumulate_rows, folded into the statistics at
// take) give the statistics of the host path (krul_accumulate into float64), over a prompt chunk
// and decode steps of growing length, for two sequences at once; a sequence restarted at
// position 0 starts over.
#include "attention_observer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

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
    observer.observe(seq, l, q[l].narrow(0, 0, prompt), k[l].narrow(0, 0, prompt), 0, 0.35);
  }
  observer.after_pass(kernels::KernelBackend::kStrata);
  for (int64_t t = prompt; t < total; ++t) {
    for (int64_t l = 0; l < kLayers; ++l) {
      observer.observe(seq, l, q[l].narrow(0, t, 1), k[l].narrow(0, 0, t + 1), t, 0.35);
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

}  // namespace
}  // namespace strata::executor
