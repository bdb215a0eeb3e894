// c10d's NCCL backend, built in nccl_backend.cpp (the only source that sees ProcessGroupNCCL.hpp
// and nccl.h); its collectives take CUDA tensors on the rank's device.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace strata::dist {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace strata::dist
