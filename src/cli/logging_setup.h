// Process-wide logging for the `strata` binary, from the deployment's logging section: spdlog's
// default logger on stderr, at the configured level, as text lines or one JSON object per line.
#pragma once

#include "strata/config/deployment_config.h"

namespace strata::cli {

void configure_logging(const config::LoggingSection& logging);

}  // namespace strata::cli
