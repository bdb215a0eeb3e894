// Test helper: comparisons of two runs' logits, one row per step ([steps][vocab]).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata::executor::testing {

using StepLogits = std::vector<std::vector<float>>;

// The largest |a - b| over every step and token (the runs must have as many steps).
inline double max_abs_diff(const StepLogits& a, const StepLogits& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
    for (size_t i = 0; i < a[s].size(); ++i) {
      worst = std::max(worst, std::abs(double(a[s][i]) - b[s][i]));
    }
  }
  return worst;
}

// Steps whose argmax is the same in both runs.
inline int same_argmax(const StepLogits& a, const StepLogits& b) {
  int same = 0;
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
    same += std::max_element(a[s].begin(), a[s].end()) - a[s].begin() ==
            std::max_element(b[s].begin(), b[s].end()) - b[s].begin();
  }
  return same;
}

// The smallest cosine similarity of the two runs' logits over the steps.
inline double min_cosine(const StepLogits& a, const StepLogits& b) {
  double worst = 1;
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < a[s].size(); ++i) {
      dot += double(a[s][i]) * b[s][i];
      na += double(a[s][i]) * a[s][i];
      nb += double(b[s][i]) * b[s][i];
    }
    worst = std::min(worst, dot / std::sqrt(na * nb));
  }
  return worst;
}

}  // namespace strata::executor::testing
