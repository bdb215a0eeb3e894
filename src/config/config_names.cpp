// How the deployment file spells values: the names of enum values (config_name) and byte sizes
// ("64MiB"), read and written the same way by the loader, the writer and validation messages.
#include <charconv>
#include <limits>

#include "strata/config/deployment_config.h"

namespace strata::config {

std::string_view config_name(std::optional<DType> value) {
  return value ? dtype_name(*value) : "auto";
}

std::string_view config_name(ChatTemplateFallback value) {
  switch (value) {
    case ChatTemplateFallback::kNone:
      return "";
    case ChatTemplateFallback::kChatML:
      return "chatml";
    case ChatTemplateFallback::kLlama3:
      return "llama3";
    case ChatTemplateFallback::kMistral:
      return "mistral";
  }
  return "?";
}

std::string_view config_name(executor::WeightStorage value) {
  return value == executor::WeightStorage::kQuantized ? "quantized" : "dequantize";
}

std::string_view config_name(DeviceKind value) {
  switch (value) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

std::string_view config_name(EvictionPolicy value) { return store::eviction_policy_name(value); }
std::string_view config_name(RestoreMode value) { return store::restore_mode_name(value); }
std::string_view config_name(LayerPairing value) { return store::layer_pairing_name(value); }

std::string_view config_name(FreeKvMethod value) {
  switch (value) {
    case FreeKvMethod::kRetrieval:
      return "retrieval";
    case FreeKvMethod::kH2o:
      return "h2o";
  }
  return "?";
}

std::string_view config_name(PreemptionMode value) {
  switch (value) {
    case PreemptionMode::kRecompute:
      return "recompute";
    case PreemptionMode::kSwap:
      return "swap";
  }
  return "?";
}

std::string_view config_name(LogLevel value) {
  switch (value) {
    case LogLevel::kTrace:
      return "trace";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

std::string_view config_name(CodecKind value) { return store::codec_name(value); }

std::string_view config_name(kernels::KernelBackend value) {
  return kernels::kernel_backend_name(value);
}

std::string_view config_name(LogFormat value) {
  switch (value) {
    case LogFormat::kText:
      return "text";
    case LogFormat::kJson:
      return "json";
  }
  return "?";
}

namespace {

struct ByteUnit {
  std::string_view suffix;
  int64_t multiplier;
};
constexpr int64_t kKiB = int64_t{1} << 10;
constexpr ByteUnit kByteUnits[] = {
    {"KiB", kKiB}, {"MiB", kKiB << 10}, {"GiB", kKiB << 20},  {"TiB", kKiB << 30},
    {"KB", 1000},  {"MB", 1000 * 1000}, {"GB", 1000'000'000}, {"TB", 1000'000'000'000},
    {"B", 1},
};

}  // namespace

std::optional<int64_t> parse_byte_size(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return std::nullopt;
  int64_t number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, number);
  if (ec != std::errc()) return std::nullopt;
  std::string_view unit = text.substr(digits);
  if (unit.empty()) return number;
  if (unit.front() == ' ') unit.remove_prefix(1);
  for (const ByteUnit& u : kByteUnits) {
    if (unit != u.suffix) continue;
    if (number > std::numeric_limits<int64_t>::max() / u.multiplier) return std::nullopt;
    return number * u.multiplier;
  }
  return std::nullopt;
}

std::string format_byte_size(int64_t num_bytes) {
  if (num_bytes > 0) {
    for (int i = 3; i >= 0; --i) {
      const ByteUnit& u = kByteUnits[i];
      if (num_bytes % u.multiplier == 0) {
        return std::to_string(num_bytes / u.multiplier) + std::string(u.suffix);
      }
    }
  }
  return std::to_string(num_bytes);
}

}  // namespace strata::config
