#include "strata/kv/leankv_policy.h"

#include "strata/common/check.h"

namespace strata::kv::leankv {
namespace {

// The lowest score (the first on ties).
TierMinimum minimum(std::span<const float> scores) {
  TierMinimum best;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (best.index < 0 || scores[i] < best.score) best = {scores[i], static_cast<int32_t>(i)};
  }
  return best;
}

}  // namespace

void prompt_tiers(std::span<const float> scores, const Thresholds& t, std::span<Tier> tiers) {
  STRATA_CHECK_EQ(scores.size(), tiers.size());
  STRATA_CHECK(t.window >= 1) << "window " << t.window;
  const int64_t n = static_cast<int64_t>(scores.size());
  for (int64_t p = 0; p < n; ++p) {
    if (p >= n - t.window) {
      tiers[p] = Tier::kWindow;
    } else if (scores[p] >= t.alpha_high / static_cast<double>(p + 1)) {
      tiers[p] = Tier::kHigh;
    } else if (scores[p] >= t.alpha_low / static_cast<double>(p + 1)) {
      tiers[p] = Tier::kLow;
    } else {
      tiers[p] = Tier::kPruned;
    }
  }
}

DecodeAction decode_step(float candidate, std::span<const float> high, std::span<const float> low,
                         int64_t length, const Thresholds& t) {
  STRATA_CHECK(length >= 1) << "length " << length;
  return decide(candidate, minimum(high), minimum(low), length, static_cast<float>(t.alpha_high),
                static_cast<float>(t.alpha_low));
}

}  // namespace strata::kv::leankv
