// Declarations only: the members of gloo::Context that c10d's ProcessGroupGloo.hpp calls inline,
// non-virtual and exported by libtorch_cpu. Contexts are created and destroyed inside libtorch.
#pragma once

#include <chrono>

namespace gloo {

class Context {
 public:
  Context() = delete;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void setTimeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds getTimeout() const;
};

}  // namespace gloo
