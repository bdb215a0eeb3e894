// Stop strings over streamed output text.
//
// The generated text arrives as deltas (e.g. from tokenizer::StreamDecoder). StopChecker returns
// the part of the text that is safe to show now, holding back any suffix that could still grow
// into a stop string, so that a client never sees a partial stop string that is later retracted.
//
// Matching rule: the text ends at the stop-string occurrence that is complete first, i.e. the one
// with the smallest end offset in the whole output text; among occurrences ending at the same
// offset the longest (earliest start) wins, then the lowest index in the list. This is the match a
// byte-by-byte stream would see first, so the result does not depend on how the text is split into
// deltas. Text from the match on is dropped, or from its end on with include_stop_str_in_output.
//
// Guarantees, for any split of the text into deltas: every prefix of the returned pieces is a
// prefix of the final output, and the concatenation of all returned pieces (append() results
// followed by flush()) is the final output. Matching is on bytes; when deltas are whole UTF-8
// characters and stop strings are valid UTF-8, every returned piece is whole characters too,
// because held-back text and matches start where a stop string starts.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/sampling/sampling_params.h"

namespace strata::sampling {

struct StopCheckResult {
  // Text to show now (possibly empty), continuing the text returned before.
  std::string text;
  // Index into SamplingParams::stop of the stop string that ended the output, once one has.
  std::optional<size_t> matched_stop;

  bool stopped() const { return matched_stop.has_value(); }
};

// One per sequence. Thread-compatible. Memory: the held-back text, shorter than the longest stop
// string, plus the latest delta.
class StopChecker {
 public:
  // Uses params.stop and params.include_stop_str_in_output (copied). With no stop strings every
  // delta passes through at once. REQUIRES: no empty stop string (checked; validate() ensures it).
  explicit StopChecker(const SamplingParams& params);

  // Adds the next piece of output text. Once a stop string has matched (in this or an earlier
  // call), the result has matched_stop set and further calls return empty text: generation should
  // end. Cost: O(length of held-back text + delta) per stop string.
  StopCheckResult append(std::string_view delta);

  // At the end of the output (other than by a stop string): the held-back text, which no longer
  // can become a stop string. Empty after a stop-string match. Call once, as the last call.
  std::string flush();

  bool stopped() const { return matched_stop_.has_value(); }

 private:
  // Length of the longest suffix of held_ that is a proper prefix of some stop string.
  size_t held_back_length() const;

  std::vector<std::string> stop_strings_;
  bool include_stop_str_in_output_ = false;
  // Output text received but not yet returned. Invariant between calls: no stop string occurs in
  // it, and it is a proper prefix of some stop string (empty when there are none).
  std::string held_;
  std::optional<size_t> matched_stop_;
};

}  // namespace strata::sampling
