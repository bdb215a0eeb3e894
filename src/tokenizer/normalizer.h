// The Unicode normalizers of HF tokenizer.json files (NFC, NFD, NFKC, NFKD, and Sequences of
// them), applied as HF applies them: to the text between added tokens that match unnormalized,
// before the normalized added tokens and the pre-tokenizer. ICU does the normalization.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"

namespace strata::tokenizer::detail {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// Immutable; normalize() is thread-safe.
class Normalizer {
 public:
  // The forms applied in order. INTERNAL if ICU cannot provide one.
  static StatusOr<std::unique_ptr<Normalizer>> create(std::vector<NormalizationForm> forms);
  ~Normalizer();

  // `text` (valid UTF-8) normalized.
  std::string normalize(std::string_view text) const;

 private:
  Normalizer() = default;
  std::vector<const void*> instances_;  // const icu::Normalizer2*, owned by ICU
};

}  // namespace strata::tokenizer::detail
