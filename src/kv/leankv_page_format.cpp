#include "strata/kv/leankv_page_format.h"

#include <algorithm>
#include <string>

namespace strata::kv::leankv {
namespace {

int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

Status check_bits(const char* which, int32_t bits, int64_t head_dim) {
  if (bits != 8 && bits != 4 && bits != 2) {
    return invalid_argument_error(std::string("LeanKV ") + which + " bits " + std::to_string(bits) +
                                  " (8, 4 or 2)");
  }
  const int64_t bytes = head_dim * bits / 8;
  if (head_dim * bits % 128 != 0 || (bytes > 64 && bytes % 64 != 0)) {
    return invalid_argument_error(std::string("LeanKV ") + which + ": head_dim " +
                                  std::to_string(head_dim) + " at " + std::to_string(bits) +
                                  " bits is " + std::to_string(bytes) +
                                  " bytes, not a multiple of 16 (and of 64 above 64)");
  }
  return Status();
}

}  // namespace

StatusOr<PageFormat> PageFormat::create(int64_t head_dim, PrecisionBits high, PrecisionBits low,
                                        int32_t high_tokens) {
  STRATA_RETURN_IF_ERROR(check_bits("high key", high.key, head_dim));
  STRATA_RETURN_IF_ERROR(check_bits("high value", high.value, head_dim));
  STRATA_RETURN_IF_ERROR(check_bits("low key", low.key, head_dim));
  STRATA_RETURN_IF_ERROR(check_bits("low value", low.value, head_dim));
  if (low.key > high.key || low.value > high.value) {
    return invalid_argument_error("LeanKV's low precision has more bits than its high one");
  }
  if (high_tokens < 1) {
    return invalid_argument_error("LeanKV high tokens per page " + std::to_string(high_tokens));
  }
  PageFormat f;
  f.head_dim_ = head_dim;
  f.high_ = high;
  f.low_ = low;
  f.high_segments_ = f.layout(high, high_tokens);
  f.page_bytes_ = f.high_segments_.end;
  // The most low tokens (a multiple of 8) whose aligned segments fit the page.
  int32_t low_tokens = static_cast<int32_t>(f.page_bytes_ / f.token_bytes(Precision::kLow)) / 8 * 8;
  while (low_tokens > high_tokens && f.layout(low, low_tokens).end > f.page_bytes_) low_tokens -= 8;
  f.low_segments_ = f.layout(low, std::max(low_tokens, high_tokens));
  return f;
}

int64_t PageFormat::token_bytes(Precision p) const {
  const PrecisionBits& b = bits(p);
  return head_dim_ * (b.key + b.value) / 8 + 2 * 4 + 4 + 4;
}

PageSegments PageFormat::layout(PrecisionBits bits, int32_t tokens) const {
  PageSegments s;
  s.tokens = tokens;
  const int64_t key_bytes = head_dim_ * bits.key / 8;
  const int64_t value_bytes = head_dim_ * bits.value / 8;
  s.key_chunk = std::min<int64_t>(64, key_bytes);
  s.value_chunk = std::min<int64_t>(64, value_bytes);
  s.key_data = 0;
  s.key_params = align16(s.key_data + key_bytes * tokens);
  s.value_data = align16(s.key_params + 4 * tokens);
  s.value_params = align16(s.value_data + value_bytes * tokens);
  s.scores = align16(s.value_params + 4 * tokens);
  s.positions = align16(s.scores + 4 * tokens);
  s.end = align16(s.positions + 4 * tokens);
  return s;
}

}  // namespace strata::kv::leankv
