#include "strata/model/model_config.h"

#include <cmath>
#include <numbers>

namespace strata::model {

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama: return "llama";
    case Architecture::kQwen2: return "qwen2";
  }
  return "unknown";
}

std::vector<float> RopeConfig::inverse_frequencies() const {
  const int64_t half = rotary_dim / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    // Same float32 formulation as HF: 1 / theta^(2i / dim).
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  switch (scaling) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      for (float& f : inv_freq) f = static_cast<float>(f / factor);
      break;
    case RopeScalingType::kFreqFactors:
      for (int64_t i = 0; i < half; ++i) inv_freq[i] /= freq_factors[i];
      break;
    case RopeScalingType::kLlama3: {
      // Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate in between.
      const double low_freq_wavelen = original_max_positions / low_freq_factor;
      const double high_freq_wavelen = original_max_positions / high_freq_factor;
      for (float& f : inv_freq) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f = static_cast<float>(f / factor);
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth = (original_max_positions / wavelen - low_freq_factor) /
                                (high_freq_factor - low_freq_factor);
          f = static_cast<float>((1 - smooth) * f / factor + smooth * f);
        }
      }
      break;
    }
  }
  return inv_freq;
}

Status ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t v) -> Status {
    if (v > 0) return Status();
    return invalid_argument_error(std::string(field) + " must be positive, got " +
                                  std::to_string(v));
  };
  STRATA_RETURN_IF_ERROR(positive("num_layers", num_layers));
  STRATA_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  STRATA_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  STRATA_RETURN_IF_ERROR(positive("num_heads", num_heads));
  STRATA_RETURN_IF_ERROR(positive("num_kv_heads", num_kv_heads));
  STRATA_RETURN_IF_ERROR(positive("head_dim", head_dim));
  STRATA_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  STRATA_RETURN_IF_ERROR(positive("max_context_tokens", max_context_tokens));
  if (num_heads % num_kv_heads != 0) {
    return invalid_argument_error("num_heads (" + std::to_string(num_heads) +
                                  ") must be a multiple of num_kv_heads (" +
                                  std::to_string(num_kv_heads) + ")");
  }
  if (rope.rotary_dim != head_dim) {
    return unimplemented_error("partial rotary embeddings (rotary_dim " +
                               std::to_string(rope.rotary_dim) + " != head_dim " +
                               std::to_string(head_dim) + ") are not supported");
  }
  if (head_dim % 2 != 0) return invalid_argument_error("head_dim must be even");
  if (rope.scaling == RopeScalingType::kFreqFactors &&
      static_cast<int64_t>(rope.freq_factors.size()) != rope.rotary_dim / 2) {
    return invalid_argument_error("rope freq_factors must have rotary_dim / 2 entries");
  }
  if (!(rms_norm_eps > 0)) return invalid_argument_error("rms_norm_eps must be positive");
  if (!(rope.theta > 0)) return invalid_argument_error("rope theta must be positive");
  return Status();
}

}  // namespace strata::model
