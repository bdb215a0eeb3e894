// The CPU loader thread that stages each layer's loaded KV ahead of the compute
// (src/executor/layer_loader.h): every layer arrives whole and in order, a buffer is never
// refilled while the step thread still uses it (checked after a simulated compute), the loader
// runs ahead by at most one layer, and destroying it mid-pass stops it. Also run under
// ThreadSanitizer (scripts/sanitize.sh thread).
#include "layer_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

namespace strata::executor {
namespace {

constexpr size_t kBytes = 4096;

TEST(LayerLoader, StagesEveryLayerInOrderWithoutOverwritingABufferInUse) {
  std::vector<std::byte> a(kBytes), b(kBytes);
  std::atomic<int64_t> copied{0};
  constexpr int64_t kLayers = 60;
  LayerLoader loader(kLayers, {a.data(), b.data()}, [&](int64_t layer, std::byte* out) {
    std::memset(out, static_cast<int>(layer & 0xff), kBytes);
    copied = layer + 1;
  });
  std::mt19937 rng(3);
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    std::byte* staged = loader.wait(layer);
    EXPECT_EQ(staged, layer % 2 == 0 ? a.data() : b.data());
    // The compute of this layer; the loader may stage the next one meanwhile, not this buffer.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    EXPECT_TRUE(std::all_of(staged, staged + kBytes, [&](std::byte v) {
      return v == static_cast<std::byte>(layer & 0xff);
    })) << "layer " << layer << "'s buffer changed while in use";
    EXPECT_LE(copied.load(), layer + 2) << "the loader ran more than one layer ahead";
    loader.release(layer);
  }
  EXPECT_EQ(copied.load(), kLayers);
}

TEST(LayerLoader, StopsWhenDestroyedMidPass) {
  std::vector<std::byte> a(kBytes), b(kBytes);
  std::atomic<int64_t> copied{0};
  {
    LayerLoader loader(1000, {a.data(), b.data()}, [&](int64_t layer, std::byte*) {
      copied = layer + 1;
    });
    for (int64_t layer = 0; layer < 4; ++layer) {
      loader.wait(layer);
      loader.release(layer);
    }
  }  // joins: with 0-3 released, layers 4 and 5 may be staged, no later one
  EXPECT_GE(copied.load(), 4);
  EXPECT_LE(copied.load(), 6);
}

}  // namespace
}  // namespace strata::executor
