#include "strata/sampling/stop_checker.h"

#include <algorithm>

#include "strata/common/check.h"

namespace strata::sampling {

StopChecker::StopChecker(const SamplingParams& params)
    : stop_strings_(params.stop), include_stop_str_in_output_(params.include_stop_str_in_output) {
  for (const std::string& stop : stop_strings_) {
    STRATA_CHECK(!stop.empty()) << "empty stop string";
  }
}

size_t StopChecker::held_back_length() const {
  const std::string_view text(held_);
  size_t longest = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t length = std::min(stop.size() - 1, text.size()); length > longest; --length) {
      if (text.ends_with(std::string_view(stop).substr(0, length))) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

StopCheckResult StopChecker::append(std::string_view delta) {
  StopCheckResult result;
  if (stopped()) {
    result.matched_stop = matched_stop_;
    return result;
  }
  held_.append(delta);

  // No occurrence can start before held_ (the text returned so far ends where held_ begins, and
  // held_ was the longest suffix that could start one) or end before this delta (it would have
  // matched in an earlier call), so searching held_ finds the first complete occurrence.
  size_t best_start = std::string::npos;
  size_t best_end = std::string::npos;
  for (size_t i = 0; i < stop_strings_.size(); ++i) {
    const size_t start = held_.find(stop_strings_[i]);
    if (start == std::string::npos) continue;
    const size_t end = start + stop_strings_[i].size();
    if (end < best_end || (end == best_end && start < best_start)) {
      best_start = start;
      best_end = end;
      matched_stop_ = i;
    }
  }
  if (stopped()) {
    result.text = held_.substr(0, include_stop_str_in_output_ ? best_end : best_start);
    result.matched_stop = matched_stop_;
    held_.clear();
    return result;
  }

  const size_t num_ready = held_.size() - held_back_length();
  result.text = held_.substr(0, num_ready);
  held_.erase(0, num_ready);
  return result;
}

std::string StopChecker::flush() {
  std::string text = std::move(held_);
  held_.clear();
  return text;
}

}  // namespace strata::sampling
