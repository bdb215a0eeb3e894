// The only source that includes ProcessGroupNCCL.hpp, against the nccl.h of the NCCL the wheel
// runs with (the nvidia-nccl-cu13 package it depends on), never a system one. Options embeds
// ncclConfig_t by value, so the NCCL version and the sizes the wheel's binary allocates are
// checked here (docs/decisions/0003-c10d-from-cpp.md).
#include "nccl_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace strata::dist {

static_assert(NCCL_VERSION_CODE == 22809, "not the NCCL (2.28.9) the torch wheel links");
static_assert(sizeof(c10d::ProcessGroupNCCL) == 0x458,
              "c10d::ProcessGroupNCCL changed size: recheck against this torch");
static_assert(sizeof(c10d::ProcessGroupNCCL::Options) == 0xf8,
              "c10d::ProcessGroupNCCL::Options changed size: recheck against this torch");

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

}  // namespace strata::dist
