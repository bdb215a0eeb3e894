#include "logging_setup.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

namespace strata::cli {
namespace {

// %* in the JSON pattern: the message as a JSON string (quoted and escaped).
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string quoted =
        nlohmann::json(std::string(msg.payload.data(), msg.payload.size())).dump();
    dest.append(quoted.data(), quoted.data() + quoted.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

spdlog::level::level_enum to_spdlog(config::LogLevel level) {
  switch (level) {
    case config::LogLevel::kTrace: return spdlog::level::trace;
    case config::LogLevel::kDebug: return spdlog::level::debug;
    case config::LogLevel::kInfo: return spdlog::level::info;
    case config::LogLevel::kWarn: return spdlog::level::warn;
    case config::LogLevel::kError: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

void configure_logging(const config::LoggingSection& logging) {
  auto logger = std::make_shared<spdlog::logger>(
      "strata", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  if (logging.format == config::LogFormat::kJson) {
    formatter->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","message":%*})");
  } else {
    formatter->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  }
  logger->set_formatter(std::move(formatter));
  logger->set_level(to_spdlog(logging.level));
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace strata::cli
