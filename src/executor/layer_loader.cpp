#include "layer_loader.h"

namespace strata::executor {

LayerLoader::LayerLoader(int64_t num_layers, std::array<std::byte*, 2> buffers,
                         std::function<void(int64_t, std::byte*)> copy)
    : num_layers_(num_layers), buffers_(buffers), copy_(std::move(copy)), thread_([this] { run(); }) {}

LayerLoader::~LayerLoader() {
  {
    std::scoped_lock lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void LayerLoader::run() {
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    {
      // Buffer layer % 2 is free once layer - 2 is released.
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || released_ >= layer - 1; });
      if (stopping_) return;
    }
    copy_(layer, buffers_[layer % 2]);
    {
      std::scoped_lock lock(mutex_);
      staged_ = layer + 1;
    }
    changed_.notify_all();
  }
}

std::byte* LayerLoader::wait(int64_t layer) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return staged_ > layer; });
  return buffers_[layer % 2];
}

void LayerLoader::release(int64_t layer) {
  {
    std::scoped_lock lock(mutex_);
    released_ = layer + 1;
  }
  changed_.notify_all();
}

}  // namespace strata::executor
