// The CPU reference of every KV page format (kv/kv_format.h): quantize-on-write and
// dequantize-on-read of one block's keys or values, in libtorch (any device). What the CPU
// attention path will read quantized pages through, and what custom quantization kernels are
// checked against.
#pragma once

#include <cstdint>

#include "strata/kv/kv_format.h"

namespace at {
class Tensor;
}
namespace c10 {
enum class ScalarType : int8_t;  // ATen's element types (opaque here)
}

namespace strata::kernels::aten {

// The ATen element type of an unquantized dtype (float32, bfloat16, float16): a compute dtype, or
// the element of a plain page format. Throws c10::Error for the quantized ones.
c10::ScalarType scalar_type(DType dtype);

// x: one block's keys or values, [num_kv_heads, block_size_tokens, head_dim], any float dtype.
// Returns its bytes in `format` (uint8, tensor_layout(...).total_bytes, on x's device): packed
// data, then the fp16 scales, then the fp16 zero points. REQUIRES validate(format, ...) is OK.
at::Tensor pack_kv(const at::Tensor& x, const kv::TensorFormat& format);

// The inverse: float32 [num_kv_heads, block_size_tokens, head_dim] from pack_kv's bytes.
at::Tensor unpack_kv(const at::Tensor& bytes, const kv::TensorFormat& format,
                     int64_t num_kv_heads, int64_t block_size_tokens, int64_t head_dim);

// Whole KV blocks, keys and values, many at once (one libtorch call chain for all of them):
// blocks [n, 2 (K, V), num_kv_heads, block_size_tokens, head_dim], any float dtype -> uint8
// [n, block_bytes(format)], each row the K region then the V region of one block. Equal, block by
// block, to pack_kv of its keys followed by pack_kv of its values.
at::Tensor pack_kv_blocks(const at::Tensor& blocks, const kv::KvFormat& format);

// The inverse: float32 [n, 2, num_kv_heads, block_size_tokens, head_dim] from [n, block_bytes].
at::Tensor unpack_kv_blocks(const at::Tensor& bytes, const kv::KvFormat& format,
                            int64_t num_kv_heads, int64_t block_size_tokens, int64_t head_dim);

}  // namespace strata::kernels::aten
