// Collectives between the ranks of a tensor-parallel group, through c10d (PyTorch's distributed
// library as the libtorch wheel ships it): Gloo between CPU processes, NCCL between GPUs (one per
// rank; tensors on that rank's device). One process per rank; ranks meet through a c10d store: a
// TCPStore that rank 0 hosts at master_address:master_port, or a FileStore at store_path (one
// machine). docs/decisions/0003-c10d-from-cpp.md says how c10d is used from C++ here.
//
// Every call is collective: all ranks make the same calls in the same order. A rank that died or
// stopped answering makes the others' calls fail with UNAVAILABLE within `timeout`, never hang.
// Tensors are at::Tensor (forward-declared: libtorch stays out of this header).
//
// Not thread-safe: one thread (the step thread) drives a communicator.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/common/status.h"

namespace at {
class Tensor;
}  // namespace at

namespace strata::dist {

enum class Transport { kGloo, kNccl };

struct GroupOptions {
  Transport transport = Transport::kGloo;  // kNccl: CUDA tensors, one GPU per rank
  int32_t rank = 0;
  int32_t world_size = 1;
  // Rendezvous: rank 0 hosts a TCP store here when master_port > 0 ...
  std::string master_address = "127.0.0.1";
  int32_t master_port = 0;
  // ... else every rank opens this file (the ranks share a file system).
  std::string store_path;
  // The address this rank's Gloo connections bind to (Gloo only).
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout{30000};  // of the rendezvous and of every collective
  // NCCL: this rank's GPU (cuda:N on its machine); -1: cuda:<rank> (one machine).
  int32_t cuda_device = -1;
};

// GPUs this process sees (0 without CUDA).
int32_t cuda_device_count();

class Communicator {
 public:
  // Joins the group: returns once every rank has joined, UNAVAILABLE after `timeout` otherwise;
  // INVALID_ARGUMENT for a rank outside [0, world_size) or no rendezvous.
  static StatusOr<std::unique_ptr<Communicator>> create(const GroupOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int32_t rank() const { return options_.rank; }
  int32_t world_size() const { return options_.world_size; }

  // Sums `tensor` over the ranks, in place (contiguous, float32/bfloat16/float16/int).
  Status all_reduce_sum(at::Tensor& tensor);
  // Every rank's `part` ([n, ...], the same shape on every rank) stacked in rank order along
  // dim 0 into `out` ([world_size * n, ...]).
  Status all_gather(const at::Tensor& part, at::Tensor& out);
  // Rank `root`'s bytes on every rank (the scheduler's plan). Sizes may differ: sent first.
  Status broadcast_bytes(std::string& bytes, int32_t root);
  Status barrier();
  // Wall time spent in this rank's collectives since it joined (waiting for the others included).
  double collective_seconds() const { return seconds_; }

 private:
  struct Group;
  Communicator(const GroupOptions& options, std::unique_ptr<Group> group);

  GroupOptions options_;
  std::unique_ptr<Group> group_;
  double seconds_ = 0;
};

}  // namespace strata::dist
