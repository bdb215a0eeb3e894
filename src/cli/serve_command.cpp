// `strata serve`: the gRPC server over one model until SIGINT/SIGTERM, which stops accepting
// calls, gives in-flight ones a grace period, and exits 0.

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "loaded_model.h"
#include "strata/server/grpc_server.h"
#include "strata/server/session_store.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage: strata serve --model PATH [options]

Serves the model over gRPC (strata.v1.Generation, plus grpc.health.v1) until SIGINT or SIGTERM.

  --model PATH            GGUF file or HF model directory
  --host H                address to bind (default 127.0.0.1)
  --grpc-port N           gRPC port (default 50051; 0 picks a free one, printed at start)
  --grace-seconds N       time in-flight requests get to finish at shutdown (default 30)
  --served-name NAME      model name reported to clients (default: the file name)
  --device, --dtype, --threads, --kv-cache-mib, --block-size, --max-num-seqs,
  --max-batched-tokens, --chat-template    as for `strata generate`
Chat with it: strata chat --server HOST:PORT
)";

Status serve(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = {"host", "grpc-port", "grace-seconds", "served-name"};
  value_flags.insert(engine_flag_names().begin(), engine_flag_names().end());
  STRATA_ASSIGN_OR_RETURN(Flags flags, Flags::parse(args, value_flags, {"help"}));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  STRATA_ASSIGN_OR_RETURN(int64_t port, flags.get_int("grpc-port", 50051));
  STRATA_ASSIGN_OR_RETURN(int64_t grace_seconds, flags.get_int("grace-seconds", 30));
  if (port < 0 || port > 65535) return invalid_argument_error("--grpc-port must be 0..65535");

  // Signals are taken synchronously by this thread; block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::fprintf(stderr, "loading %s ...\n", flags.get("model", "").c_str());
  STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(flags));
  server::SessionStore sessions;
  server::GrpcServerOptions options;
  options.host = flags.get("host", "127.0.0.1");
  options.port = static_cast<int>(port);
  options.served_name =
      flags.get("served-name", std::filesystem::path(flags.get("model", "")).stem().string());
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<server::GrpcServer> grpc,
      server::GrpcServer::start(*loaded.engine, loaded.chat_template, sessions, options));
  std::fprintf(stderr, "serving %s on %s:%d (gRPC)\n", options.served_name.c_str(),
               options.host.c_str(), grpc->port());
  std::printf("grpc_port=%d\n", grpc->port());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::fprintf(stderr, "signal %d: draining for up to %lds\n", signal_number,
               static_cast<long>(grace_seconds));
  grpc->shutdown(std::chrono::seconds(grace_seconds));
  return Status();
}

}  // namespace

int run_serve(const std::vector<std::string>& args) { return exit_code("strata serve", serve(args)); }

}  // namespace strata::cli
