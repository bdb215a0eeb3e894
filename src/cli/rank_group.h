// The processes of a tensor-parallel deployment (devices.tensor_parallel_size > 1;
// docs/tensor-parallelism.md). `strata serve` on each machine is that machine's first rank: it
// starts the machine's other ranks (this binary's `strata serve` again, with the hidden
// --tp-local-rank flag), watches them, and joins the group with them. Global rank 0 (node 0's
// first process) serves the front door; every other rank runs the passes rank 0 sends.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "strata/config/deployment_config.h"
#include "strata/dist/communicator.h"

namespace strata::cli {

// Hidden flags of `strata serve` for the ranks it starts: the rank on this machine, and the
// rendezvous file of a one-machine group.
inline constexpr const char* kLocalRankFlag = "tp-local-rank";
inline constexpr const char* kRendezvousFlag = "tp-rendezvous";

class RankGroup {
 public:
  // Joins the group as local rank `local_rank` (nullopt: this machine's first process, which
  // starts the others with `args` and the hidden flags). Sets deployment.devices to this rank's
  // device (cuda:<first + local rank>, or the cpu with the cores divided among the machine's
  // ranks). `on_failure` is called (from a watcher thread) when a started rank exits while the
  // group is not stopping. UNAVAILABLE when the ranks do not meet within the collective timeout.
  static StatusOr<std::unique_ptr<RankGroup>> join(config::DeploymentConfig& deployment,
                                                   const std::vector<std::string>& args,
                                                   std::optional<int32_t> local_rank,
                                                   const std::string& rendezvous,
                                                   std::function<void(const std::string&)> on_failure);
  // Waits up to 10 s for the started ranks to exit, then kills them.
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  dist::Communicator& communicator() { return *group_; }
  int32_t rank() const { return group_->rank(); }
  // From now on the started ranks' exits are the orderly stop, not a failure.
  void stopping() { stopping_ = true; }
  // Kills the started ranks at once (after a failure) and removes the rendezvous file this
  // process created: a process that exits at once after it leaves nothing behind.
  void kill_ranks();

 private:
  RankGroup() = default;
  void remove_rendezvous_file();

  std::unique_ptr<dist::Communicator> group_;
  std::vector<pid_t> children_;
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
  std::string rendezvous_file_;  // removed at the end when this process created it
};

}  // namespace strata::cli
