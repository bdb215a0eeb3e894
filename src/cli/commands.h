// Subcommands of the `strata` binary. Each takes the arguments after its name and returns the
// process exit code; errors are printed to stderr as one line.
#pragma once

#include <string>
#include <vector>

#include "strata/common/status.h"

namespace strata::cli {

int run_generate(const std::vector<std::string>& args);
int run_chat(const std::vector<std::string>& args);
int run_serve(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_profile(const std::vector<std::string>& args);

// Exit code for a command's final status (0 ok, 2 bad usage, 1 anything else), printing a
// non-ok status to stderr as "<command>: <status>".
int exit_code(const char* command, const Status& status);

}  // namespace strata::cli
