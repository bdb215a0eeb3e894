#include "strata/dist/communicator.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstring>
#include <exception>
#include <vector>

#include "gloo_backend.h"
#include "nccl_backend.h"

namespace strata::dist {

struct Communicator::Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

namespace {

// c10d reports a dead, hung or unreachable peer by throwing: one Status for all of them.
// Adds the call's wall time to `seconds`.
template <typename F>
Status collective(const GroupOptions& o, const char* what, double& seconds, F&& run) {
  const auto start = std::chrono::steady_clock::now();
  struct Timed {
    std::chrono::steady_clock::time_point start;
    double& seconds;
    ~Timed() {
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  } timed{start, seconds};
  try {
    run();
    return Status();
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  std::string("tensor-parallel group: ") + what + " failed on rank " +
                      std::to_string(o.rank) + " of " + std::to_string(o.world_size) + ": " +
                      e.what());
  }
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> Communicator::create(const GroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return invalid_argument_error("tensor-parallel group: rank " + std::to_string(options.rank) +
                                  " is not in [0, " + std::to_string(options.world_size) + ")");
  }
  if (options.master_port <= 0 && options.store_path.empty()) {
    return invalid_argument_error("tensor-parallel group: set a master port or a store path");
  }
  auto group = std::make_unique<Group>();
  double join_seconds = 0;
  const Status joined = collective(options, "joining", join_seconds, [&] {
    c10::intrusive_ptr<c10d::Store> base;
    if (options.master_port > 0) {
      c10d::TCPStoreOptions tcp;
      tcp.port = static_cast<uint16_t>(options.master_port);
      tcp.isServer = options.rank == 0;
      tcp.numWorkers = options.world_size;
      tcp.timeout = options.timeout;
      base = c10::make_intrusive<c10d::TCPStore>(options.master_address, tcp);
    } else {
      base = c10::make_intrusive<c10d::FileStore>(options.store_path, options.world_size);
      base->setTimeout(options.timeout);
    }
    group->store = c10::make_intrusive<c10d::PrefixStore>("strata/tp", base);
    group->backend = options.transport == Transport::kNccl
                         ? make_nccl_backend(group->store, options.rank, options.world_size,
                                             options.timeout)
                         : make_gloo_backend(group->store, options.rank, options.world_size,
                                             options.hostname, options.timeout);
  });
  if (!joined.ok()) return joined;
  return std::unique_ptr<Communicator>(new Communicator(options, std::move(group)));
}

Communicator::Communicator(const GroupOptions& options, std::unique_ptr<Group> group)
    : options_(options), group_(std::move(group)) {}

Communicator::~Communicator() = default;

Status Communicator::all_reduce_sum(at::Tensor& tensor) {
  return collective(options_, "all-reduce", seconds_, [&] {
    std::vector<at::Tensor> tensors = {tensor};
    group_->backend->allreduce(tensors)->wait();
  });
}

Status Communicator::all_gather(const at::Tensor& part, at::Tensor& out) {
  if (out.size(0) != part.size(0) * options_.world_size || !out.is_contiguous() ||
      !part.is_contiguous()) {
    return invalid_argument_error("all_gather: out must be contiguous [world_size * n, ...]");
  }
  return collective(options_, "all-gather", seconds_, [&] {
    at::Tensor input = part;
    group_->backend->_allgather_base(out, input)->wait();
  });
}

Status Communicator::broadcast_bytes(std::string& bytes, int32_t root) {
  return collective(options_, "broadcast", seconds_, [&] {
    c10d::BroadcastOptions from;
    from.rootRank = root;
    // NCCL moves device memory only: the bytes travel through the rank's GPU there.
    const at::Device device = options_.transport == Transport::kNccl
                                  ? at::Device(at::kCUDA, static_cast<int8_t>(
                                                                options_.cuda_device >= 0
                                                                    ? options_.cuda_device
                                                                    : options_.rank))
                                  : at::Device(at::kCPU);
    std::vector<at::Tensor> size = {
        at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong).to(device)};
    group_->backend->broadcast(size, from)->wait();
    const int64_t n = size[0].item<int64_t>();
    at::Tensor host = at::empty({std::max<int64_t>(n, 1)}, at::kByte);
    if (options_.rank == root) std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
    std::vector<at::Tensor> data = {host.to(device)};
    group_->backend->broadcast(data, from)->wait();
    if (options_.rank != root) {
      host = data[0].to(at::kCPU);
      bytes.assign(static_cast<const char*>(host.data_ptr()), n);
    }
  });
}

Status Communicator::barrier() {
  return collective(options_, "barrier", seconds_, [&] { group_->backend->barrier()->wait(); });
}

int32_t cuda_device_count() { return c10::cuda::device_count(); }

}  // namespace strata::dist
