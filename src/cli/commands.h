// Subcommands of the `strata` binary. Each takes the arguments after its name and returns the
// process exit code; errors are printed to stderr as one line.
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

int run_generate(const std::vector<std::string>& args);
int run_chat(const std::vector<std::string>& args);
int run_serve(const std::vector<std::string>& args);

}  // namespace strata::cli
