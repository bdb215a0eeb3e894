// The `strata` binary: dispatches to a subcommand.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"

namespace {

constexpr const char* kUsage = R"(usage: strata <command> [options]

commands:
  serve      serve a model over gRPC
  generate   run one prompt and stream the continuation (offline, no server)
  chat       interactive multi-turn chat with a local model in the terminal
  bench      benchmark a server or the in-process engine (serve, multiturn, offline)
  profile    measure prefill, tier and codec costs for AdaptCache's placement (a profile file)

Run `strata <command> --help` for the options of a command.
)";

}  // namespace

int strata::cli::exit_code(const char* command, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "%s: %s\n", command, status.to_string().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "generate") return strata::cli::run_generate(args);
  if (command == "chat") return strata::cli::run_chat(args);
  if (command == "serve") return strata::cli::run_serve(args);
  if (command == "bench") return strata::cli::run_bench(args);
  if (command == "profile") return strata::cli::run_profile(args);
  std::fprintf(stderr, "strata: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
