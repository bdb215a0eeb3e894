// The deployment config parser on arbitrary YAML. A config that parses must survive its own
// round trip: to_yaml() parses back to an equal config.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "strata/config/config_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = strata::config::parse_config(text, "fuzz.yaml");
  if (!config.ok()) return 0;
  const std::string emitted = strata::config::to_yaml(*config);
  auto again = strata::config::parse_config(emitted, "emitted.yaml");
  if (!again.ok() || !(*again == *config)) std::abort();
  return 0;
}
