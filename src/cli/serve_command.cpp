// `strata serve`: the gRPC server over one model until SIGINT/SIGTERM, which stops accepting
// calls, gives in-flight ones the configured grace period, and exits 0. With
// devices.tensor_parallel_size > 1 it also starts and watches the machine's other ranks
// (rank_group.h); when a rank dies or hangs it exits 1 at once.

#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "commands.h"
#include "loaded_model.h"
#include "logging_setup.h"
#include "rank_group.h"
#include "strata/server/grpc_server.h"
#include "strata/server/http_server.h"
#include "strata/server/session_store.h"
#include "strata/store/redis_client.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage: strata serve (--config FILE | --model PATH) [options]

Serves a model over gRPC (strata.v1.Generation, plus grpc.health.v1) and an OpenAI-compatible
HTTP API (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics) until SIGINT or
SIGTERM.

  --config FILE           deployment file (configs/default.yaml documents every key)
  --set SECTION.KEY=VALUE override one key of it (repeatable), e.g. --set scheduler.max_num_seqs=32
  --model PATH            GGUF file or HF model directory (model.path)
  --host H                address to bind (server.host, default 127.0.0.1)
  --grpc-port N           gRPC port (server.grpc_port, default 50051; 0 disables it)
  --http-port N           HTTP port (server.http_port, default 8000; 0 disables it)
  --grace-seconds N       time in-flight requests get at shutdown (server.shutdown_grace_seconds)
  --served-name NAME      model name reported to clients (model.served_name)
  --device, --dtype, --weights, --threads, --kv-cache-mib, --block-size, --max-num-seqs,
  --max-batched-tokens, --chat-template, --chat-template-file    as for `strata generate`
With devices.tensor_parallel_size N > 1 it starts this machine's other ranks itself (one process
each) and exits 1 when one dies or hangs (docs/tensor-parallelism.md).
Prints "grpc_port=N" and "http_port=N" on stdout once serving.
Chat with it: strata chat --server HOST:PORT, or any OpenAI client at http://HOST:PORT/v1
)";

// One line per custom op that the start-up self-check found wrong (an error: it now runs on
// libtorch), then which implementation serves each op.
void log_kernel_report(const kernels::KernelReport& report) {
  std::string summary;
  for (const kernels::OpCheck& c : report.ops) {
    if (c.result == kernels::SelfCheckResult::kMismatch) {
      spdlog::error("kernel self-check: {} disagrees with libtorch ({}); serving it with libtorch",
                    kernels::kernel_op_name(c.op), c.detail);
    }
    summary += std::string(summary.empty() ? "" : ", ") + kernels::kernel_op_name(c.op) + "=" +
               kernels::kernel_backend_name(c.backend);
  }
  spdlog::info("kernels: {} (self-check {:.3f} s)", summary, report.self_check_seconds);
}

void log_weight_report(const executor::WeightReport& r) {
  spdlog::info(
      "weights: {} (matmuls {} int4, {} int8, {} dense; embedding {}), {} MiB, loaded in {:.1f} s",
      config::config_name(r.storage), r.int4, r.int8, r.dense, r.embedding, r.bytes >> 20,
      r.load_seconds);
  if (!r.kernel_fallback.empty()) {
    spdlog::error("quantized weight kernels failed their start-up check ({}): those weights "
                  "serve in the next form (int4 -> int8 -> dense)",
                  r.kernel_fallback);
  }
}

// Why a tensor-parallel group failed, for the signal that reports it to serve()'s main thread.
std::mutex group_failure_mutex;
std::string group_failure;

void report_group_failure(const std::string& why) {
  {
    std::scoped_lock lock(group_failure_mutex);
    if (!group_failure.empty()) return;
    group_failure = why;
  }
  kill(getpid(), SIGUSR1);
}

// A failed group ends the process at once: in-flight requests cannot finish, and a rank that
// hangs would hold an orderly shutdown for the collective timeout.
[[noreturn]] void exit_after_group_failure(RankGroup& group) {
  group.kill_ranks();
  {
    std::scoped_lock lock(group_failure_mutex);
    spdlog::error("{}: exiting", group_failure);
    std::fprintf(stderr, "strata serve: %s\n", group_failure.c_str());
  }
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(1);
}

Status serve(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = deployment_flag_names();
  value_flags.insert({kLocalRankFlag, kRendezvousFlag});
  STRATA_ASSIGN_OR_RETURN(
      Flags flags, Flags::parse(args, value_flags, {"help"}, deployment_repeated_flag_names()));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig deployment, deployment_from_flags(flags));
  configure_logging(deployment.logging);
  const config::ServerSection& server = deployment.server;
  // Only rank 0 of a tensor-parallel group serves the front door.
  const bool front_door = deployment.devices.tensor_parallel_size == 1 ||
                          (deployment.devices.node_rank == 0 && !flags.has(kLocalRankFlag));
  if (front_door && server.grpc_port == 0 && server.http_port == 0) {
    return invalid_argument_error("server.grpc_port and server.http_port are both 0: nothing to serve");
  }
  // The one environment read of the binary: API keys named by server.api_keys_env.
  STRATA_ASSIGN_OR_RETURN(
      std::vector<std::string> api_keys,
      config::resolve_api_keys(server, [](const std::string& name) -> std::optional<std::string> {
        const char* value = std::getenv(name.c_str());
        return value ? std::optional<std::string>(value) : std::nullopt;
      }));

  // Signals are taken synchronously by this thread; block them before any other thread starts.
  // SIGUSR1: a tensor-parallel group failed.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<RankGroup> ranks;
  if (deployment.devices.tensor_parallel_size > 1) {
    std::optional<int32_t> local_rank;
    if (flags.has(kLocalRankFlag)) {
      STRATA_ASSIGN_OR_RETURN(const int64_t r, flags.get_int(kLocalRankFlag, 0));
      local_rank = static_cast<int32_t>(r);
    }
    // The flags the other ranks of this machine are started with: this command's, minus the
    // hidden ones.
    std::vector<std::string> rank_args;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == std::string("--") + kLocalRankFlag ||
          args[i] == std::string("--") + kRendezvousFlag) {
        ++i;
        continue;
      }
      rank_args.push_back(args[i]);
    }
    STRATA_ASSIGN_OR_RETURN(ranks, RankGroup::join(deployment, rank_args, local_rank,
                                                   flags.get(kRendezvousFlag, ""),
                                                   report_group_failure));
    spdlog::info("tensor-parallel rank {} of {} on {}", ranks->rank(),
                 deployment.devices.tensor_parallel_size,
                 executor::device_name(deployment.devices.device));
    if (ranks->rank() != 0) {
      // A rank that only computes: a signal, or its own started ranks' failure, ends it.
      std::atomic<bool> served{false};
      std::thread watch([&served, &ranks, signals] {
        int signal_number = 0;
        sigwait(&signals, &signal_number);
        if (served) return;
        if (signal_number == SIGUSR1) exit_after_group_failure(*ranks);
        ranks->kill_ranks();
        std::_Exit(0);
      });
      Status status = serve_rank(deployment, ranks->communicator());
      served = true;
      kill(getpid(), SIGTERM);  // wakes the watcher (blocked in every thread: nothing else sees it)
      watch.join();
      ranks->stopping();
      if (!status.ok()) ranks->kill_ranks();
      return status;
    }
  }

  spdlog::info("loading {}", deployment.model.path);
  STRATA_ASSIGN_OR_RETURN(
      LoadedEngine loaded,
      load_engine(deployment, ranks ? &ranks->communicator() : nullptr,
                  [](const Status& failed) { report_group_failure(failed.message()); }));
  log_weight_report(loaded.engine->executor().weight_report());
  log_kernel_report(loaded.engine->executor().kernel_report());
  const std::string served_name = deployment.model.effective_served_name();
  // Chat sessions are journaled beside the KV store's SSD tier, whose KV they resume with.
  std::unique_ptr<server::SessionStore> sessions;
  if (!deployment.kv_store.ssd_dir.empty()) {
    std::error_code created;
    std::filesystem::create_directories(deployment.kv_store.ssd_dir, created);
    STRATA_ASSIGN_OR_RETURN(
        sessions, server::SessionStore::open(deployment.kv_store.ssd_dir + "/sessions.journal"));
  } else {
    sessions = std::make_unique<server::SessionStore>();
  }
  // With a remote tier, replicas share the sessions through the same Redis as their KV.
  if (const store::RemoteTierConfig& remote = deployment.kv_store.remote;
      deployment.kv_store.enabled() && remote.enabled()) {
    STRATA_ASSIGN_OR_RETURN(
        std::unique_ptr<store::RedisClient> redis,
        store::RedisClient::create({remote.address, remote.username, remote.password_env,
                                    remote.database, std::chrono::milliseconds(remote.timeout_ms),
                                    std::chrono::milliseconds(remote.retry_ms)}));
    sessions->share_through(std::move(redis), std::chrono::seconds(remote.ttl_seconds > 0
                                                                       ? remote.ttl_seconds
                                                                       : 7 * 24 * 3600));
  }
  std::unique_ptr<server::GrpcServer> grpc;
  if (server.grpc_port != 0) {
    server::GrpcServerOptions options;
    options.host = server.host;
    options.port = server.grpc_port;
    options.served_name = served_name;
    options.sampling_defaults = loaded.sampling_defaults;
    options.api_keys = api_keys;
    STRATA_ASSIGN_OR_RETURN(
        grpc, server::GrpcServer::start(*loaded.engine, loaded.chat_template, *sessions, options));
    spdlog::info("serving {} on {}:{} (gRPC)", served_name, server.host, grpc->port());
    std::printf("grpc_port=%d\n", grpc->port());
  }
  std::unique_ptr<server::HttpServer> http;
  if (server.http_port != 0) {
    server::HttpServerOptions options;
    options.host = server.host;
    options.port = server.http_port;
    options.served_name = served_name;
    options.sampling_defaults = loaded.sampling_defaults;
    options.api_keys = api_keys;
    options.request_timeout = std::chrono::seconds(server.request_timeout_seconds);
    options.max_connections = static_cast<size_t>(server.max_connections);
    STRATA_ASSIGN_OR_RETURN(http,
                            server::HttpServer::start(*loaded.engine, loaded.chat_template, options));
    spdlog::info("serving {} on http://{}:{}/v1 (OpenAI-compatible HTTP)", served_name,
                 server.host, http->port());
    std::printf("http_port=%d\n", http->port());
  }
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  if (signal_number == SIGUSR1 && ranks) exit_after_group_failure(*ranks);
  if (ranks) ranks->stopping();
  spdlog::info("signal {}: draining in-flight requests for up to {}s", signal_number,
               server.shutdown_grace_seconds);
  // Both stop accepting at once, then share the grace period for in-flight requests.
  const auto grace = std::chrono::seconds(server.shutdown_grace_seconds);
  std::thread http_drain([&] {
    if (http) http->shutdown(grace);
  });
  if (grpc) grpc->shutdown(grace);
  http_drain.join();
  spdlog::info("stopped");
  return Status();
}

}  // namespace

int run_serve(const std::vector<std::string>& args) { return exit_code("strata serve", serve(args)); }

}  // namespace strata::cli
