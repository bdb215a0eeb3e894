// `strata serve`: the gRPC server over one model until SIGINT/SIGTERM, which stops accepting
// calls, gives in-flight ones the configured grace period, and exits 0.

#include <csignal>
#include <cstdio>

#include "commands.h"
#include "loaded_model.h"
#include "strata/server/grpc_server.h"
#include "strata/server/session_store.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage: strata serve (--config FILE | --model PATH) [options]

Serves a model over gRPC (strata.v1.Generation, plus grpc.health.v1) until SIGINT or SIGTERM.

  --config FILE           deployment file (configs/default.yaml documents every key)
  --set SECTION.KEY=VALUE override one key of it (repeatable), e.g. --set scheduler.max_num_seqs=32
  --model PATH            GGUF file or HF model directory (model.path)
  --host H                address to bind (server.host, default 127.0.0.1)
  --grpc-port N           gRPC port (server.grpc_port, default 50051)
  --grace-seconds N       time in-flight requests get at shutdown (server.shutdown_grace_seconds)
  --served-name NAME      model name reported to clients (model.served_name)
  --device, --dtype, --threads, --kv-cache-mib, --block-size, --max-num-seqs,
  --max-batched-tokens, --chat-template    as for `strata generate`
Prints "grpc_port=N" on stdout once serving. Chat with it: strata chat --server HOST:PORT
)";

Status serve(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = deployment_flag_names();
  STRATA_ASSIGN_OR_RETURN(
      Flags flags, Flags::parse(args, value_flags, {"help"}, deployment_repeated_flag_names()));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig deployment, deployment_from_flags(flags));
  const config::ServerSection& server = deployment.server;
  if (server.grpc_port == 0) {
    return invalid_argument_error("server.grpc_port is 0: no server to run");
  }

  // Signals are taken synchronously by this thread; block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::fprintf(stderr, "loading %s ...\n", deployment.model.path.c_str());
  STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(deployment));
  server::SessionStore sessions;
  server::GrpcServerOptions options;
  options.host = server.host;
  options.port = server.grpc_port;
  options.served_name = deployment.model.effective_served_name();
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<server::GrpcServer> grpc,
      server::GrpcServer::start(*loaded.engine, loaded.chat_template, sessions, options));
  std::fprintf(stderr, "serving %s on %s:%d (gRPC)\n", options.served_name.c_str(),
               options.host.c_str(), grpc->port());
  std::printf("grpc_port=%d\n", grpc->port());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::fprintf(stderr, "signal %d: draining for up to %ds\n", signal_number,
               server.shutdown_grace_seconds);
  grpc->shutdown(std::chrono::seconds(server.shutdown_grace_seconds));
  return Status();
}

}  // namespace

int run_serve(const std::vector<std::string>& args) { return exit_code("strata serve", serve(args)); }

}  // namespace strata::cli
