// The tensor-parallel communicator over c10d's Gloo, with real processes: each test forks one
// process per rank (the parent only waits), which meet through a FileStore or a TCPStore on
// loopback and check every collective's result against what the ranks contributed. A rank that
// dies or never joins makes the others fail within the timeout instead of hanging.
#include "strata/dist/communicator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support/free_port.h"
#include "support/temp_dir.h"

namespace strata::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Runs body(rank) in `world` forked processes; each returns its exit code (0: its checks held).
std::vector<int> run_ranks(int world, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = body(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

#define RANK_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, #cond); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

GroupOptions file_group(const test_util::TempDir& dir, int rank, int world) {
  GroupOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_path = dir.file("store");
  o.timeout = std::chrono::seconds(10);
  return o;
}

// Every collective, with values that differ per rank.
int exercise(Communicator& c) {
  const int rank = c.rank();
  const int world = c.world_size();
  at::Tensor x = at::arange(1000, at::kFloat) * static_cast<float>(rank + 1);
  RANK_CHECK(c.all_reduce_sum(x).ok());
  const float factor = world * (world + 1) / 2.0f;
  RANK_CHECK(at::equal(x, at::arange(1000, at::kFloat) * factor));
  at::Tensor h = at::full({64}, static_cast<float>(rank + 1), at::kBFloat16);
  RANK_CHECK(c.all_reduce_sum(h).ok());
  RANK_CHECK(at::equal(h, at::full({64}, factor, at::kBFloat16)));

  at::Tensor part = at::full({3, 5}, static_cast<float>(rank), at::kFloat);
  at::Tensor gathered = at::empty({3 * world, 5}, at::kFloat);
  RANK_CHECK(c.all_gather(part, gathered).ok());
  for (int r = 0; r < world; ++r) {
    RANK_CHECK(at::equal(gathered.slice(0, 3 * r, 3 * r + 3), at::full({3, 5}, float(r))));
  }
  at::Tensor wrong = at::empty({3, 5}, at::kFloat);
  RANK_CHECK(c.all_gather(part, wrong).code() == StatusCode::kInvalidArgument || world == 1);

  std::string plan = rank == 1 ? std::string("plan of step 7 \0 with a NUL", 27) : "stale";
  RANK_CHECK(c.broadcast_bytes(plan, 1 % world).ok());
  RANK_CHECK(world == 1 || plan == std::string("plan of step 7 \0 with a NUL", 27));
  std::string empty = rank == 0 ? "" : "not yet";
  RANK_CHECK(c.broadcast_bytes(empty, 0).ok());
  RANK_CHECK(empty.empty());
  RANK_CHECK(c.barrier().ok());
  return 0;
}

TEST(CommunicatorTest, CollectivesOverGlooWithTwoAndFourRanks) {
  for (int world : {2, 4}) {
    test_util::TempDir dir;
    const std::vector<int> codes = run_ranks(world, [&](int rank) {
      StatusOr<std::unique_ptr<Communicator>> c = Communicator::create(file_group(dir, rank, world));
      RANK_CHECK(c.ok());
      return exercise(**c);
    });
    EXPECT_EQ(codes, std::vector<int>(world, 0)) << world << " ranks";
  }
}

TEST(CommunicatorTest, RendezvousThroughATcpStoreOnRankZero) {
  const int port = test_util::free_port();
  const std::vector<int> codes = run_ranks(2, [&](int rank) {
    GroupOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.master_port = port;
    o.timeout = std::chrono::seconds(10);
    StatusOr<std::unique_ptr<Communicator>> c = Communicator::create(o);
    RANK_CHECK(c.ok());
    return exercise(**c);
  });
  EXPECT_EQ(codes, std::vector<int>(2, 0));
}

TEST(CommunicatorTest, ADeadRankFailsTheOthersWithinTheTimeout) {
  test_util::TempDir dir;
  const std::vector<int> codes = run_ranks(2, [&](int rank) {
    GroupOptions o = file_group(dir, rank, 2);
    o.timeout = std::chrono::seconds(3);
    StatusOr<std::unique_ptr<Communicator>> c = Communicator::create(o);
    RANK_CHECK(c.ok());
    RANK_CHECK((*c)->barrier().ok());
    if (rank == 1) ::_exit(0);  // dies without a word
    const Clock::time_point start = Clock::now();
    at::Tensor x = at::ones({16}, at::kFloat);
    const Status status = (*c)->all_reduce_sum(x);
    RANK_CHECK(status.code() == StatusCode::kUnavailable);
    RANK_CHECK(Clock::now() - start < std::chrono::seconds(10));
    std::fprintf(stderr, "rank 0 saw: %s\n", status.message().c_str());
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(2, 0));
}

TEST(CommunicatorTest, AHungRankFailsTheOthersWithinTheTimeout) {
  test_util::TempDir dir;
  const std::vector<int> codes = run_ranks(2, [&](int rank) {
    GroupOptions o = file_group(dir, rank, 2);
    o.timeout = std::chrono::seconds(2);
    StatusOr<std::unique_ptr<Communicator>> c = Communicator::create(o);
    RANK_CHECK(c.ok());
    RANK_CHECK((*c)->barrier().ok());
    if (rank == 1) {  // alive, connected, silent
      std::this_thread::sleep_for(std::chrono::seconds(6));
      ::_exit(0);
    }
    const Clock::time_point start = Clock::now();
    at::Tensor x = at::ones({16}, at::kFloat);
    RANK_CHECK((*c)->all_reduce_sum(x).code() == StatusCode::kUnavailable);
    RANK_CHECK(Clock::now() - start < std::chrono::seconds(5));
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(2, 0));
}

TEST(CommunicatorTest, ARankThatNeverJoinsFailsTheRendezvous) {
  test_util::TempDir dir;
  const std::vector<int> codes = run_ranks(1, [&](int rank) {
    GroupOptions o = file_group(dir, rank, 2);  // rank 1 never comes
    o.timeout = std::chrono::seconds(2);
    const Clock::time_point start = Clock::now();
    StatusOr<std::unique_ptr<Communicator>> c = Communicator::create(o);
    RANK_CHECK(c.status().code() == StatusCode::kUnavailable);
    RANK_CHECK(Clock::now() - start < std::chrono::seconds(20));
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(1, 0));
}

// NCCL, compiled and linked everywhere; run where a GPU is (one rank: one GPU suffices).
TEST(CommunicatorTest, NcclSingleRankOnAGpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU: the NCCL path is compiled and linked, not run";
  test_util::TempDir dir;
  const std::vector<int> codes = run_ranks(1, [&](int rank) {
    GroupOptions o = file_group(dir, rank, 1);
    o.transport = Transport::kNccl;
    StatusOr<std::unique_ptr<Communicator>> c = Communicator::create(o);
    RANK_CHECK(c.ok());
    at::Tensor x = at::arange(64, at::TensorOptions(at::kFloat).device(at::kCUDA, 0));
    RANK_CHECK((*c)->all_reduce_sum(x).ok());
    RANK_CHECK(at::equal(x.cpu(), at::arange(64, at::kFloat)));
    std::string plan = "plan";
    RANK_CHECK((*c)->broadcast_bytes(plan, 0).ok() && plan == "plan");
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(1, 0));
}

TEST(CommunicatorTest, BadOptionsAreRefusedBeforeAnyNetwork) {
  GroupOptions o;
  o.rank = 2;
  o.world_size = 2;
  o.store_path = "/nonexistent/store";
  EXPECT_EQ(Communicator::create(o).status().code(), StatusCode::kInvalidArgument);
  o.rank = 0;
  o.store_path.clear();
  EXPECT_EQ(Communicator::create(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::dist
