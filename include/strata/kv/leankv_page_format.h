// LeanKV's unified pages (LeanKV §4.1, docs/leankv.md): fixed-byte pages, each holding tokens of
// one (request, layer, KV head) at one precision. A page's precision fixes how many tokens it
// holds; the page size is the bytes of `high_tokens` tokens at the high precision.
//
// Byte layout of a page holding T = tokens_per_page(precision) tokens of head dim d, key bits kb,
// value bits vb, each segment at a 16-byte aligned offset:
//   key data     [d*kb/8 / C_k, T, C_k] bytes   token t's key bytes cut in chunks of C_k bytes,
//                                               chunk c of every token together (the kernel's
//                                               groups read consecutive tokens contiguously);
//                                               C_k = min(64, d*kb/8). Inside the bytes, element
//                                               f of the token is at bits (f % (8/kb)) * kb of
//                                               byte f / (8/kb) (the first element in the low bits)
//   key params   [T, 2] fp16                    per token: scale, zero (min)
//   value data   [d*vb/8 / C_v, T, C_v] bytes   the same for values
//   value params [T, 2] fp16
//   scores       [T] fp32                       the token's attention accumulator
//   (kv/leankv_policy.h) positions    [T] int32                      the token's position in its
//   sequence
// Quantization is asymmetric min-max per token and head: scale = (max - min) / (2^b - 1),
// zero = min, both rounded to fp16 first; q = clamp(round((x - zero) / scale), 0, 2^b - 1);
// x^ = scale * q + zero (scale 0 when max == min: every q is 0).
#pragma once

#include <cstdint>

#include "strata/common/status.h"

namespace strata::kv::leankv {

enum class Precision : int8_t { kHigh = 0, kLow = 1 };

struct PrecisionBits {
  int32_t key = 8;
  int32_t value = 4;
};

// Where one page's segments lie, in bytes from the page's start.
struct PageSegments {
  int32_t tokens = 0;                   // T
  int64_t key_data = 0, key_chunk = 0;  // offset, C_k
  int64_t key_params = 0;
  int64_t value_data = 0, value_chunk = 0;
  int64_t value_params = 0;
  int64_t scores = 0;
  int64_t positions = 0;
  int64_t end = 0;  // bytes used, <= page bytes
};

class PageFormat {
 public:
  // high / low: bits of each precision (8, 4 or 2; d * bits / 8 a multiple of 16, and of 64 when
  // above 64, so chunks are whole 16-byte vectors); high_tokens: tokens a high page holds (>= 1).
  // The page is the bytes of high_tokens high tokens; a low page holds as many low tokens as fit,
  // rounded down to a multiple of 8 (and at least high_tokens). INVALID_ARGUMENT for anything else.
  static StatusOr<PageFormat> create(int64_t head_dim, PrecisionBits high, PrecisionBits low,
                                     int32_t high_tokens);

  int64_t head_dim() const { return head_dim_; }
  int64_t page_bytes() const { return page_bytes_; }
  const PrecisionBits& bits(Precision p) const { return p == Precision::kHigh ? high_ : low_; }
  const PageSegments& segments(Precision p) const {
    return p == Precision::kHigh ? high_segments_ : low_segments_;
  }
  int32_t tokens_per_page(Precision p) const { return segments(p).tokens; }
  // Bytes one token takes at a precision, its share of every segment (before alignment).
  int64_t token_bytes(Precision p) const;

 private:
  PageSegments layout(PrecisionBits bits, int32_t tokens) const;

  int64_t head_dim_ = 0;
  PrecisionBits high_, low_;
  int64_t page_bytes_ = 0;
  PageSegments high_segments_, low_segments_;
};

}  // namespace strata::kv::leankv
