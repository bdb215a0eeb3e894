// Page formats: how the keys and the values of one KV block are stored, separately for K and V.
// The fp32 / bf16 / fp16 pools are the unquantized instances; quantized ones (fp8-e4m3, int8,
// int4, int2) carry an fp16 scale, and integers an fp16 zero point, per group of elements.
//
// Byte layout of one block's K (or V) for num_kv_heads H, block_size_tokens B, head_dim D:
//   data    [H, B, D] elements packed at dtype_bits each (sub-byte: the first element in the low
//           bits), H * B * D * bits / 8 bytes
//   scales  [H, G] fp16, after the data at the next 16-byte boundary (quantized dtypes only)
//   zeros   [H, G] fp16, right after the scales (integer dtypes only)
// where G, the groups of one head, is B * D / group_size for per-token groups (group_size
// consecutive elements of one token's head_dim: LeanKV's per-token per-head groups, KIVI's V)
// and D for per-channel groups (one channel across the block's B tokens: KIVI's K; the block is
// quantized when it is full, before that it stays in the pool's full-precision window).
// Integers are min-max quantized: scale = (max - min) / (2^bits - 1), zero = min,
// q = round((x - zero) / scale); fp8 is symmetric: scale = amax / 448, q = fp8(x / scale).
// fp8 per tensor ("fp8/tensor") has no scales: q = fp8(clamp(x, -448, 448)), the scale fixed at
// 1 as in vLLM's fp8 KV cache without calibrated scales (its default).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/common/dtype.h"
#include "strata/common/status.h"

namespace strata::kv {

enum class Grouping : uint8_t {
  kNone,        // unquantized
  kPerToken,    // group_size consecutive elements of one token's head_dim
  kPerChannel,  // one channel of one head across the block's tokens
  kPerTensor,   // fp8 only: one fixed scale of 1 for every element, no scale stored
};

struct TensorFormat {
  DType dtype = DType::kBFloat16;
  Grouping grouping = Grouping::kNone;
  int32_t group_size = 0;  // per-token groups: elements per group (divides head_dim)

  bool operator==(const TensorFormat&) const = default;
};

// The format of a block: its keys and its values.
struct KvFormat {
  TensorFormat key;
  TensorFormat value;

  // An unquantized format, K and V alike.
  static KvFormat plain(DType dtype) { return {{dtype}, {dtype}}; }
  bool operator==(const KvFormat&) const = default;
};

// Where the parts of one block's K or V lie, in bytes from the start of that tensor's region.
struct TensorLayout {
  int64_t data_bytes = 0;
  int64_t scales_offset = 0;  // data_bytes rounded up to 16 when scales follow
  int64_t groups_per_head = 0;
  int64_t scale_bytes = 0;    // H * groups_per_head * 2, or 0
  int64_t zeros_offset = 0;
  int64_t zero_bytes = 0;
  int64_t total_bytes = 0;
};

TensorLayout tensor_layout(const TensorFormat& format, int64_t num_kv_heads,
                           int64_t block_size_tokens, int64_t head_dim);
// Bytes of one block (K then V) of one layer.
int64_t block_bytes(const KvFormat& format, int64_t num_kv_heads, int64_t block_size_tokens,
                    int64_t head_dim);

// INVALID_ARGUMENT naming the problem: a grouping that does not fit the dtype (quantized dtypes
// need one, float ones none), a per-token group size that does not divide head_dim, or packed
// data that does not fill whole bytes.
Status validate(const TensorFormat& format, int64_t head_dim, int64_t block_size_tokens);

// KIVI's layout at `bits` (8, 4 or 2): keys quantized per channel across a block's tokens, values
// per token in groups of 32 (the KV store's lossy codecs, docs/adaptcache.md).
KvFormat kivi_format(int bits);

// "bfloat16", "int4/token32", "int2/channel", "k:int8/token128,v:int4/token32".
std::string format_name(const TensorFormat& format);
std::string format_name(const KvFormat& format);
// The inverse of format_name (dtype spellings of dtype_from_name accepted: "bf16", "fp8"):
// INVALID_ARGUMENT naming the text for anything else. Does not validate() the result.
StatusOr<KvFormat> parse_format(std::string_view name);

}  // namespace strata::kv
