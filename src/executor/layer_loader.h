// CPU loads ahead of the compute (private to the executor): a thread copies each layer's loaded
// KV blocks of a pass into one of two staging buffers while the step thread computes the layer
// before it (layer l in buffer l % 2), so the loads of layer l + 1 overlap the compute of layer l
// (Krul's recompute/load pipeline; CachedAttention's layer-wise loading). On CUDA the read stream
// does this instead. No libtorch on the loader thread: plain copies only.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace strata::executor {

class LayerLoader {
 public:
  // copy(layer, destination) fills `destination` with layer `layer`'s bytes; it runs on the
  // loader thread for layers 0, 1, ... in order, never into a buffer the step thread still uses.
  LayerLoader(int64_t num_layers, std::array<std::byte*, 2> buffers,
              std::function<void(int64_t, std::byte*)> copy);
  // Stops the thread (mid-pass too: a failed pass) and joins it; a copy waiting for a streamed
  // chunk (KvLoad::arrivals) finishes that wait first, which the read bounds.
  ~LayerLoader();
  LayerLoader(const LayerLoader&) = delete;
  LayerLoader& operator=(const LayerLoader&) = delete;

  // Blocks until layer `layer` is staged; its buffer, the step thread's until release(layer).
  std::byte* wait(int64_t layer);
  void release(int64_t layer);

 private:
  void run();

  const int64_t num_layers_;
  const std::array<std::byte*, 2> buffers_;
  const std::function<void(int64_t, std::byte*)> copy_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t staged_ = 0;    // layers [0, staged_) are in their buffers
  int64_t released_ = 0;  // layers [0, released_) are done with theirs
  bool stopping_ = false;
  std::thread thread_;    // last: starts once the rest is initialised
};

}  // namespace strata::executor
