#include "normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

namespace strata::tokenizer::detail {

StatusOr<std::unique_ptr<Normalizer>> Normalizer::create(std::vector<NormalizationForm> forms) {
  std::unique_ptr<Normalizer> n(new Normalizer());
  for (NormalizationForm form : forms) {
    UErrorCode error = U_ZERO_ERROR;
    const icu::Normalizer2* instance = nullptr;
    switch (form) {
      case NormalizationForm::kNfc:
        instance = icu::Normalizer2::getNFCInstance(error);
        break;
      case NormalizationForm::kNfd:
        instance = icu::Normalizer2::getNFDInstance(error);
        break;
      case NormalizationForm::kNfkc:
        instance = icu::Normalizer2::getNFKCInstance(error);
        break;
      case NormalizationForm::kNfkd:
        instance = icu::Normalizer2::getNFKDInstance(error);
        break;
    }
    if (U_FAILURE(error) || instance == nullptr) {
      return internal_error(std::string("ICU normalizer unavailable: ") + u_errorName(error));
    }
    n->instances_.push_back(instance);
  }
  return n;
}

Normalizer::~Normalizer() = default;

std::string Normalizer::normalize(std::string_view text) const {
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  for (const void* instance : instances_) {
    UErrorCode error = U_ZERO_ERROR;
    s = static_cast<const icu::Normalizer2*>(instance)->normalize(s, error);
    if (U_FAILURE(error)) return std::string(text);  // ICU only fails on invalid input
  }
  std::string out;
  s.toUTF8String(out);
  return out;
}

}  // namespace strata::tokenizer::detail
