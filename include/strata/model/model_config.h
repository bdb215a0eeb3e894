// Architecture hyper-parameters of a decoder-only transformer, read from GGUF metadata or a HF
// config.json. Plain data; validate() checks internal consistency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/common/status.h"

namespace strata::model {

enum class Architecture {
  kLlama,  // Llama 2/3, Mistral, SmolLM: no attention biases
  kQwen2,  // Qwen2/2.5: biases on Q, K and V projections
};

const char* architecture_name(Architecture arch);

enum class RopeScalingType {
  kNone,
  kLinear,  // positions divided by `factor`
  kLlama3,  // Llama-3.1 frequency-dependent scaling (low/high frequency factors)
  kFreqFactors,  // explicit per-frequency divisors (GGUF `rope_freqs.weight`)
};

struct RopeConfig {
  double theta = 10000.0;
  int64_t rotary_dim = 0;  // dimensions rotated per head (== head_dim for supported models)
  RopeScalingType scaling = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
  std::vector<float> freq_factors;  // [rotary_dim / 2], only for kFreqFactors

  // Inverse frequencies [rotary_dim / 2] after scaling; what the executor rotates by.
  std::vector<float> inverse_frequencies() const;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string name;
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_context_tokens = 0;
  double rms_norm_eps = 1e-5;
  RopeConfig rope;
  bool tied_embeddings = false;  // LM head reuses the token embedding
  bool qkv_bias = false;

  // INVALID_ARGUMENT naming the first inconsistent field.
  Status validate() const;
};

}  // namespace strata::model
