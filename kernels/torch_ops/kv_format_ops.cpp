#include "strata/kernels/kv_format_ops.h"

#include <ATen/ATen.h>

#include <vector>

namespace strata::kernels::aten {
namespace {

constexpr float kFp8Max = 448.0f;  // largest finite e4m3fn

// One row per group: per token [H, G, group_size] (consecutive head_dim elements), per channel
// [H, D, B] (one channel across the block's tokens).
at::Tensor to_groups(const at::Tensor& x, const kv::TensorFormat& f) {
  const int64_t h = x.size(0), b = x.size(1), d = x.size(2);
  if (f.grouping == kv::Grouping::kPerChannel) return x.permute({0, 2, 1});
  return x.reshape({h, b * d / f.group_size, f.group_size});
}

at::Tensor from_groups(const at::Tensor& g, const kv::TensorFormat& f, int64_t h, int64_t b,
                       int64_t d) {
  if (f.grouping == kv::Grouping::kPerChannel) return g.permute({0, 2, 1}).contiguous();
  return g.reshape({h, b, d});
}

// uint8 codes in [0, 2^bits) -> bytes, the first code of each byte in its lowest bits.
at::Tensor pack_bits(const at::Tensor& codes, int bits) {
  const at::Tensor flat = codes.reshape({-1});
  if (bits == 8) return flat;
  const int per_byte = 8 / bits;
  const at::Tensor lanes = flat.reshape({-1, per_byte}).to(at::kInt);
  at::Tensor shifts = at::arange(0, 8, bits, lanes.options());
  return lanes.bitwise_left_shift(shifts).sum(1).to(at::kByte);
}

at::Tensor unpack_bits(const at::Tensor& bytes, int bits, int64_t count) {
  if (bits == 8) return bytes.slice(0, 0, count);
  const at::Tensor wide = bytes.to(at::kInt).unsqueeze(1);
  const at::Tensor shifts = at::arange(0, 8, bits, wide.options());
  return wide.bitwise_right_shift(shifts).bitwise_and((1 << bits) - 1).reshape({-1}).slice(0, 0, count);
}

at::Tensor as_bytes(const at::Tensor& t) { return t.contiguous().view(at::kByte).reshape({-1}); }

}  // namespace

at::ScalarType scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat16:
      return at::kHalf;
    default:
      break;
  }
  TORCH_CHECK(false, "not an unquantized dtype: ", dtype_name(dtype));
}

at::Tensor pack_kv(const at::Tensor& x, const kv::TensorFormat& f) {
  const int64_t h = x.size(0), b = x.size(1), d = x.size(2);
  const kv::TensorLayout layout = kv::tensor_layout(f, h, b, d);
  at::Tensor out = at::zeros({layout.total_bytes}, x.options().dtype(at::kByte));
  if (!dtype_is_quantized(f.dtype)) {
    out.copy_(as_bytes(x.to(scalar_type(f.dtype))));
    return out;
  }
  if (f.grouping == kv::Grouping::kPerTensor) {  // fp8 with its scale fixed at 1
    out.copy_(as_bytes(x.to(at::kFloat).clamp(-kFp8Max, kFp8Max).to(at::kFloat8_e4m3fn)));
    return out;
  }
  const at::Tensor groups = to_groups(x.to(at::kFloat), f);
  at::Tensor scale, codes;
  if (f.dtype == DType::kFloat8E4M3) {
    scale = (groups.abs().amax(-1, true) / kFp8Max).to(at::kHalf);
    const at::Tensor s = scale.to(at::kFloat);
    const at::Tensor scaled = (groups / at::where(s > 0, s, at::ones_like(s))).clamp(-kFp8Max, kFp8Max);
    codes = as_bytes(from_groups(scaled, f, h, b, d).to(at::kFloat8_e4m3fn));
  } else {
    const int bits = dtype_bits(f.dtype);
    const at::Tensor lo = groups.amin(-1, true), hi = groups.amax(-1, true);
    scale = ((hi - lo) / static_cast<float>((1 << bits) - 1)).to(at::kHalf);
    const at::Tensor zero = lo.to(at::kHalf);
    const at::Tensor s = scale.to(at::kFloat);
    const at::Tensor q = ((groups - zero.to(at::kFloat)) / at::where(s > 0, s, at::ones_like(s)))
                             .round()
                             .clamp(0, (1 << bits) - 1)
                             .to(at::kByte);
    codes = pack_bits(from_groups(q, f, h, b, d), bits);
    out.slice(0, layout.zeros_offset, layout.total_bytes).copy_(as_bytes(zero));
  }
  out.slice(0, 0, layout.data_bytes).copy_(codes);
  out.slice(0, layout.scales_offset, layout.scales_offset + layout.scale_bytes).copy_(as_bytes(scale));
  return out;
}

at::Tensor unpack_kv(const at::Tensor& bytes, const kv::TensorFormat& f, int64_t h, int64_t b,
                     int64_t d) {
  const kv::TensorLayout layout = kv::tensor_layout(f, h, b, d);
  TORCH_CHECK(bytes.numel() == layout.total_bytes, "a ", kv::format_name(f), " block of [", h, ", ",
              b, ", ", d, "] has ", layout.total_bytes, " bytes, got ", bytes.numel());
  const at::Tensor data = bytes.slice(0, 0, layout.data_bytes);
  if (!dtype_is_quantized(f.dtype)) {
    return data.view(scalar_type(f.dtype)).reshape({h, b, d}).to(at::kFloat);
  }
  if (f.grouping == kv::Grouping::kPerTensor) {
    return data.view(at::kFloat8_e4m3fn).to(at::kFloat).reshape({h, b, d});
  }
  const at::Tensor scale = bytes.slice(0, layout.scales_offset, layout.scales_offset + layout.scale_bytes)
                               .view(at::kHalf)
                               .to(at::kFloat)
                               .reshape({h, layout.groups_per_head, 1});
  at::Tensor values;
  if (f.dtype == DType::kFloat8E4M3) {
    values = data.view(at::kFloat8_e4m3fn).to(at::kFloat).reshape({h, b, d});
    return from_groups(to_groups(values, f) * scale, f, h, b, d);
  }
  const at::Tensor zero = bytes.slice(0, layout.zeros_offset, layout.total_bytes)
                              .view(at::kHalf)
                              .to(at::kFloat)
                              .reshape({h, layout.groups_per_head, 1});
  const at::Tensor q = unpack_bits(data, dtype_bits(f.dtype), h * b * d).to(at::kFloat).reshape({h, b, d});
  return from_groups(to_groups(q, f) * scale + zero, f, h, b, d);
}

namespace {

// n blocks' regions of one tensor (K or V), [n, layout.total_bytes], as the bytes pack_kv gives
// for one tensor of n * H heads (data of every head, then every scale, then every zero): the
// per-head parts of a region are in head order, so n regions concatenate head-wise.
at::Tensor regions_to_heads(const at::Tensor& regions, const kv::TensorFormat& f, int64_t n,
                            int64_t h, int64_t b, int64_t d) {
  const kv::TensorLayout one = kv::tensor_layout(f, h, b, d);
  const kv::TensorLayout all = kv::tensor_layout(f, n * h, b, d);
  at::Tensor out = at::zeros({all.total_bytes}, regions.options());
  out.slice(0, 0, all.data_bytes).copy_(regions.slice(1, 0, one.data_bytes).reshape({-1}));
  if (one.scale_bytes > 0) {
    out.slice(0, all.scales_offset, all.scales_offset + all.scale_bytes)
        .copy_(
            regions.slice(1, one.scales_offset, one.scales_offset + one.scale_bytes).reshape({-1}));
  }
  if (one.zero_bytes > 0) {
    out.slice(0, all.zeros_offset, all.total_bytes)
        .copy_(regions.slice(1, one.zeros_offset, one.total_bytes).reshape({-1}));
  }
  return out;
}

// The inverse of regions_to_heads.
at::Tensor heads_to_regions(const at::Tensor& bytes, const kv::TensorFormat& f, int64_t n,
                            int64_t h, int64_t b, int64_t d) {
  const kv::TensorLayout one = kv::tensor_layout(f, h, b, d);
  const kv::TensorLayout all = kv::tensor_layout(f, n * h, b, d);
  at::Tensor out = at::zeros({n, one.total_bytes}, bytes.options());
  out.slice(1, 0, one.data_bytes).copy_(bytes.slice(0, 0, all.data_bytes).view({n, -1}));
  if (one.scale_bytes > 0) {
    out.slice(1, one.scales_offset, one.scales_offset + one.scale_bytes)
        .copy_(
            bytes.slice(0, all.scales_offset, all.scales_offset + all.scale_bytes).view({n, -1}));
  }
  if (one.zero_bytes > 0) {
    out.slice(1, one.zeros_offset, one.total_bytes)
        .copy_(bytes.slice(0, all.zeros_offset, all.total_bytes).view({n, -1}));
  }
  return out;
}

}  // namespace

at::Tensor pack_kv_blocks(const at::Tensor& blocks, const kv::KvFormat& format) {
  const int64_t n = blocks.size(0), h = blocks.size(2), b = blocks.size(3), d = blocks.size(4);
  std::vector<at::Tensor> parts;
  for (int64_t kv_index = 0; kv_index < 2; ++kv_index) {
    const kv::TensorFormat& f = kv_index == 0 ? format.key : format.value;
    const at::Tensor heads = blocks.select(1, kv_index).reshape({n * h, b, d});
    parts.push_back(heads_to_regions(pack_kv(heads, f), f, n, h, b, d));
  }
  return at::cat(parts, 1);
}

at::Tensor unpack_kv_blocks(const at::Tensor& bytes, const kv::KvFormat& format, int64_t h,
                            int64_t b, int64_t d) {
  const int64_t n = bytes.size(0);
  const int64_t key_bytes = kv::tensor_layout(format.key, h, b, d).total_bytes;
  TORCH_CHECK(bytes.size(1) == kv::block_bytes(format, h, b, d), "a ", kv::format_name(format),
              " block has ", kv::block_bytes(format, h, b, d), " bytes, got ", bytes.size(1));
  std::vector<at::Tensor> parts;
  for (int64_t kv_index = 0; kv_index < 2; ++kv_index) {
    const kv::TensorFormat& f = kv_index == 0 ? format.key : format.value;
    const at::Tensor regions =
        kv_index == 0 ? bytes.slice(1, 0, key_bytes) : bytes.slice(1, key_bytes, bytes.size(1));
    parts.push_back(
        unpack_kv(regions_to_heads(regions, f, n, h, b, d), f, n * h, b, d).view({n, h, b, d}));
  }
  return at::stack(parts, 1);
}

}  // namespace strata::kernels::aten
