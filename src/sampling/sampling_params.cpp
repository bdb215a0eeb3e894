#include "strata/sampling/sampling_params.h"

#include <cmath>
#include <sstream>

namespace strata::sampling {
namespace {

// "<field> must be <requirement>, got <value>".
template <typename T>
Status field_error(const char* field, const char* requirement, const T& value) {
  std::ostringstream os;
  os << field << " must be " << requirement << ", got " << value;
  return invalid_argument_error(os.str());
}

// NaN and infinities fail every range check below with the same message shape.
Status check_finite(const char* field, double value) {
  if (!std::isfinite(value)) return field_error(field, "finite", value);
  return Status::ok_status();
}

// The messages below spell the limits out.
static_assert(kMaxNumLogprobs == 20 && kMaxNumStopStrings == 16);
static_assert(kMaxAbsPresencePenalty == 2.0 && kMaxAbsFrequencyPenalty == 2.0);

}  // namespace

Status SamplingParams::validate(int64_t vocab_size) const {
  if (vocab_size <= 0) return field_error("vocab_size", "> 0", vocab_size);

  STRATA_RETURN_IF_ERROR(check_finite("temperature", temperature));
  if (temperature < 0) return field_error("temperature", ">= 0", temperature);
  if (top_k < 0) return field_error("top_k", ">= 0 (0 = off)", top_k);
  STRATA_RETURN_IF_ERROR(check_finite("top_p", top_p));
  if (!(top_p > 0 && top_p <= 1)) return field_error("top_p", "in (0, 1]", top_p);
  STRATA_RETURN_IF_ERROR(check_finite("min_p", min_p));
  if (!(min_p >= 0 && min_p <= 1)) return field_error("min_p", "in [0, 1]", min_p);

  STRATA_RETURN_IF_ERROR(check_finite("repetition_penalty", repetition_penalty));
  if (!(repetition_penalty > 0)) {
    return field_error("repetition_penalty", "> 0 (1 = off)", repetition_penalty);
  }
  STRATA_RETURN_IF_ERROR(check_finite("presence_penalty", presence_penalty));
  if (std::abs(presence_penalty) > kMaxAbsPresencePenalty) {
    return field_error("presence_penalty", "in [-2, 2]", presence_penalty);
  }
  STRATA_RETURN_IF_ERROR(check_finite("frequency_penalty", frequency_penalty));
  if (std::abs(frequency_penalty) > kMaxAbsFrequencyPenalty) {
    return field_error("frequency_penalty", "in [-2, 2]", frequency_penalty);
  }

  if (max_tokens < 1) return field_error("max_tokens", ">= 1", max_tokens);
  if (num_logprobs < 0 || num_logprobs > kMaxNumLogprobs) {
    return field_error("num_logprobs", "in [0, 20]", num_logprobs);
  }
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxNumLogprobs)) {
    return field_error("prompt_logprobs", "in [0, 20]", *prompt_logprobs);
  }

  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const TokenId id = stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      std::ostringstream os;
      os << "stop_token_ids[" << i << "] must be in [0, " << vocab_size << "), got " << id;
      return invalid_argument_error(os.str());
    }
  }
  if (stop.size() > kMaxNumStopStrings) {
    return field_error("stop", "at most 16 strings", std::to_string(stop.size()) + " strings");
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return invalid_argument_error("stop[" + std::to_string(i) + "] must be non-empty");
    }
  }
  return Status::ok_status();
}

SamplingDefaults SamplingDefaults::overlaid_with(const SamplingDefaults& over) const {
  SamplingDefaults out = *this;
  auto take = [](auto& field, const auto& value) {
    if (value) field = value;
  };
  take(out.temperature, over.temperature);
  take(out.top_k, over.top_k);
  take(out.top_p, over.top_p);
  take(out.min_p, over.min_p);
  take(out.repetition_penalty, over.repetition_penalty);
  take(out.presence_penalty, over.presence_penalty);
  take(out.frequency_penalty, over.frequency_penalty);
  return out;
}

SamplingParams SamplingDefaults::params() const {
  SamplingParams p;
  p.temperature = temperature.value_or(p.temperature);
  p.top_k = top_k.value_or(p.top_k);
  p.top_p = top_p.value_or(p.top_p);
  p.min_p = min_p.value_or(p.min_p);
  p.repetition_penalty = repetition_penalty.value_or(p.repetition_penalty);
  p.presence_penalty = presence_penalty.value_or(p.presence_penalty);
  p.frequency_penalty = frequency_penalty.value_or(p.frequency_penalty);
  return p;
}

std::string SamplingDefaults::describe() const {
  std::ostringstream os;
  auto put = [&](const char* name, const auto& value) {
    if (value) os << (os.tellp() > 0 ? " " : "") << name << "=" << *value;
  };
  put("temperature", temperature);
  put("top_k", top_k);
  put("top_p", top_p);
  put("min_p", min_p);
  put("repetition_penalty", repetition_penalty);
  put("presence_penalty", presence_penalty);
  put("frequency_penalty", frequency_penalty);
  return os.tellp() > 0 ? os.str() : "none";
}

Status SamplingDefaults::validate() const { return params().validate(/*vocab_size=*/1); }

}  // namespace strata::sampling
