// The one place that constructs c10d's Gloo backend (gloo_backend.cpp, compiled against the
// declaration shim in gloo_shim/): everything else sees only c10d::Backend's virtual interface,
// whose objects and vtables libtorch itself creates (docs/decisions/0003-c10d-from-cpp.md).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace strata::dist {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    const std::string& hostname,
                                                    std::chrono::milliseconds timeout);

}  // namespace strata::dist
