#include "strata/kv/leankv_policy.h"

#include "strata/common/check.h"

namespace strata::kv::leankv {
namespace {

// Index of the lowest score (the first on ties), or -1 for none.
int32_t argmin(std::span<const float> scores) {
  int32_t best = -1;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (best < 0 || scores[i] < scores[best]) best = static_cast<int32_t>(i);
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
  const double t_high = t.alpha_high / static_cast<double>(length);
  const double t_low = t.alpha_low / static_cast<double>(length);
  DecodeAction action;
  if (candidate >= t_high) {
    action.candidate = Tier::kHigh;
    const int32_t v = argmin(high);
    if (v >= 0 && high[v] < t_high) {
      action.victim = v;
      action.victim_to = high[v] >= t_low ? Tier::kLow : Tier::kPruned;
    }
  } else if (candidate >= t_low) {
    action.candidate = Tier::kLow;
    const int32_t v = argmin(low);
    if (v >= 0 && low[v] < t_low) {
      action.victim = v;
      action.victim_to = Tier::kPruned;
    }
  }
  return action;
}

}  // namespace strata::kv::leankv
