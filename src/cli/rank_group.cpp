#include "rank_group.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <system_error>

namespace strata::cli {
namespace {

using executor::DeviceKind;

// Starts `strata serve` again as local rank `local_rank`; it dies with this process.
StatusOr<pid_t> start_rank(const std::vector<std::string>& args, int32_t local_rank,
                           const std::string& rendezvous) {
  std::error_code error;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  if (error) return internal_error("cannot find this binary: " + error.message());
  std::vector<std::string> argv = {self, "serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {std::string("--") + kLocalRankFlag, std::to_string(local_rank)});
  if (!rendezvous.empty()) {
    argv.insert(argv.end(), {std::string("--") + kRendezvousFlag, rendezvous});
  }
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return internal_error("fork failed");
  if (pid == 0) {  // only async-signal-safe calls until exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(raw[0], raw.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

StatusOr<std::unique_ptr<RankGroup>> RankGroup::join(
    config::DeploymentConfig& deployment, const std::vector<std::string>& args,
    std::optional<int32_t> local_rank, const std::string& rendezvous,
    std::function<void(const std::string&)> on_failure) {
  executor::DevicesConfig& devices = deployment.devices;
  const int32_t per_node = devices.tensor_parallel_size / devices.nodes;
  std::unique_ptr<RankGroup> group(new RankGroup());
  std::string store_path = rendezvous;
  if (!local_rank) {
    if (devices.master_port == 0 && store_path.empty()) {
      const auto now = std::chrono::system_clock::now().time_since_epoch().count();
      store_path = (std::filesystem::temp_directory_path() /
                    ("strata-tp-" + std::to_string(getpid()) + "-" + std::to_string(now)))
                       .string();
      group->rendezvous_file_ = store_path;
    }
    for (int32_t r = 1; r < per_node; ++r) {
      StatusOr<pid_t> pid = start_rank(args, r, store_path);
      if (!pid.ok()) return pid.status();
      group->children_.push_back(*pid);
    }
    group->watcher_ = std::thread([g = group.get(), on_failure = std::move(on_failure)] {
      size_t running = g->children_.size();
      while (running > 0) {
        int status = 0;
        const pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          continue;
        }
        --running;
        if (g->stopping_) continue;
        const std::string how = WIFSIGNALED(status)
                                    ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                    : "exited with status " + std::to_string(WEXITSTATUS(status));
        on_failure("tensor-parallel rank process " + std::to_string(pid) + " " + how);
      }
    });
  }
  const int32_t local = local_rank.value_or(0);
  const bool cuda = devices.device.kind == DeviceKind::kCuda ||
                    (devices.device.kind == DeviceKind::kAuto && dist::cuda_device_count() > 0);
  if (cuda) {
    devices.device = {DeviceKind::kCuda,
                      (devices.device.kind == DeviceKind::kCuda ? devices.device.index : 0) + local};
  } else {
    devices.device = {DeviceKind::kCpu, 0};
    if (devices.cpu_threads == 0) {
      devices.cpu_threads =
          std::max<int32_t>(1, static_cast<int32_t>(std::thread::hardware_concurrency()) / per_node);
    }
  }
  dist::GroupOptions options;
  options.transport = cuda ? dist::Transport::kNccl : dist::Transport::kGloo;
  options.rank = devices.node_rank * per_node + local;
  options.world_size = devices.tensor_parallel_size;
  options.master_address = devices.master_address;
  options.master_port = devices.master_port;
  options.store_path = store_path;
  options.timeout = std::chrono::seconds(devices.collective_timeout_seconds);
  options.cuda_device = cuda ? devices.device.index : -1;
  StatusOr<std::unique_ptr<dist::Communicator>> joined = dist::Communicator::create(options);
  if (!joined.ok()) {
    group->stopping();
    group->kill_ranks();
    return joined.status();
  }
  group->group_ = std::move(joined).value();
  return group;
}

void RankGroup::kill_ranks() {
  for (pid_t pid : children_) kill(pid, SIGKILL);
  remove_rendezvous_file();
}

void RankGroup::remove_rendezvous_file() {
  if (rendezvous_file_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove(rendezvous_file_, ignored);
}

RankGroup::~RankGroup() {
  stopping_ = true;
  if (watcher_.joinable()) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline &&
           std::any_of(children_.begin(), children_.end(),
                       [](pid_t pid) { return kill(pid, 0) == 0; })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill_ranks();
    watcher_.join();
  }
  group_.reset();
  remove_rendezvous_file();
}

}  // namespace strata::cli
