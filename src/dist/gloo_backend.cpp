// The only source that includes ProcessGroupGloo.hpp. Its gloo includes resolve to gloo_shim/
// (declarations matching the gloo inside libtorch_cpu); the sizes below are what the wheel's
// binary allocates (checked against its own operator new calls), so a torch upgrade that changes
// them fails the build instead of corrupting memory.
#include "gloo_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace strata::dist {

static_assert(sizeof(c10d::ProcessGroupGloo) == 0x1e8,
              "c10d::ProcessGroupGloo changed size: recheck gloo_shim/ against this torch");
static_assert(sizeof(c10d::ProcessGroupGloo::Options) == 0xb0,
              "c10d::ProcessGroupGloo::Options changed size: recheck gloo_shim/ against this torch");

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    const std::string& hostname,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace strata::dist
