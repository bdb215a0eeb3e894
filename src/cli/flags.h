// Minimal `--name value` / `--name=value` / `--switch` command-line parsing for the subcommands.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "strata/common/status.h"

namespace strata::cli {

class Flags {
 public:
  // `value_flags` take a value, `switch_flags` do not; `repeated_flags` take a value and may
  // appear several times. Unknown flags and positional arguments are INVALID_ARGUMENT naming them.
  static StatusOr<Flags> parse(const std::vector<std::string>& args,
                               const std::set<std::string>& value_flags,
                               const std::set<std::string>& switch_flags,
                               const std::set<std::string>& repeated_flags = {});

  bool has(const std::string& name) const { return values_.contains(name); }
  std::string get(const std::string& name, const std::string& fallback) const;
  StatusOr<int64_t> get_int(const std::string& name, int64_t fallback) const;
  StatusOr<double> get_double(const std::string& name, double fallback) const;
  // Every value of a repeated flag, in order.
  const std::vector<std::string>& get_all(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;  // switches map to ""
  std::map<std::string, std::vector<std::string>> repeated_;
};

}  // namespace strata::cli
