#include "flags.h"

#include <charconv>

namespace strata::cli {

StatusOr<Flags> Flags::parse(const std::vector<std::string>& args,
                             const std::set<std::string>& value_flags,
                             const std::set<std::string>& switch_flags,
                             const std::set<std::string>& repeated_flags) {
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!arg.starts_with("--")) return invalid_argument_error("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switch_flags.contains(name)) {
      if (value) return invalid_argument_error("--" + name + " takes no value");
      flags.values_[name] = "";
    } else if (value_flags.contains(name) || repeated_flags.contains(name)) {
      if (!value) {
        if (i + 1 >= args.size()) return invalid_argument_error("--" + name + " needs a value");
        value = args[++i];
      }
      if (repeated_flags.contains(name)) {
        flags.repeated_[name].push_back(*value);
      } else {
        flags.values_[name] = *value;
      }
    } else {
      return invalid_argument_error("unknown flag --" + name);
    }
  }
  return flags;
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

StatusOr<int64_t> Flags::get_int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v = 0;
  const std::string& s = it->second;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) {
    return invalid_argument_error("--" + name + " must be an integer, got '" + s + "'");
  }
  return v;
}

const std::vector<std::string>& Flags::get_all(const std::string& name) const {
  static const std::vector<std::string> kNone;
  auto it = repeated_.find(name);
  return it == repeated_.end() ? kNone : it->second;
}

StatusOr<double> Flags::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    const double v = std::stod(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  return invalid_argument_error("--" + name + " must be a number, got '" + it->second + "'");
}

}  // namespace strata::cli
