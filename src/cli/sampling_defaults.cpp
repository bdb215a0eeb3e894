#include "sampling_defaults.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata::cli {

StatusOr<sampling::SamplingDefaults> model_sampling_defaults(const model::GgufFile* gguf,
                                                             const std::string& model_dir) {
  sampling::SamplingDefaults out;
  if (gguf != nullptr) {
    auto number = [&](const char* key, std::optional<double>& field) -> Status {
      if (!gguf->has_key(key)) return Status();
      STRATA_ASSIGN_OR_RETURN(double v, gguf->get_float(key));
      field = v;
      return Status();
    };
    STRATA_RETURN_IF_ERROR(number("general.sampling.temp", out.temperature));
    STRATA_RETURN_IF_ERROR(number("general.sampling.top_p", out.top_p));
    STRATA_RETURN_IF_ERROR(number("general.sampling.min_p", out.min_p));
    STRATA_RETURN_IF_ERROR(number("general.sampling.penalty_repeat", out.repetition_penalty));
    if (gguf->has_key("general.sampling.top_k")) {
      STRATA_ASSIGN_OR_RETURN(int64_t k, gguf->get_int("general.sampling.top_k"));
      out.top_k = static_cast<int32_t>(k);
    }
    return out;
  }
  const std::filesystem::path path = std::filesystem::path(model_dir) / "generation_config.json";
  std::ifstream in(path);
  if (!in) return out;
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return data_loss_error(path.string() + " is not a JSON object");
  auto number = [&](const char* key, std::optional<double>& field) {
    if (config.contains(key) && config[key].is_number()) field = config[key].get<double>();
  };
  number("temperature", out.temperature);
  number("top_p", out.top_p);
  number("min_p", out.min_p);
  number("repetition_penalty", out.repetition_penalty);
  if (config.contains("top_k") && config["top_k"].is_number_integer()) {
    out.top_k = config["top_k"].get<int32_t>();
  }
  return out;
}

StatusOr<sampling::SamplingDefaults> resolve_sampling_defaults(
    const config::SamplingSection& deployment, const model::GgufFile* gguf,
    const std::string& model_dir) {
  sampling::SamplingDefaults defaults = deployment;
  if (deployment.use_generation_config) {
    STRATA_ASSIGN_OR_RETURN(sampling::SamplingDefaults model_defaults,
                            model_sampling_defaults(gguf, model_dir));
    const Status valid = model_defaults.validate();
    if (!valid.ok())
      return invalid_argument_error("the model's sampling defaults: " + valid.message());
    if (model_defaults != sampling::SamplingDefaults{}) {
      spdlog::info("sampling: the model's own defaults {}", model_defaults.describe());
    }
    defaults = defaults.overlaid_with(model_defaults);
  }
  spdlog::info("sampling defaults for requests that leave them unset: {}", defaults.describe());
  return defaults;
}

}  // namespace strata::cli
