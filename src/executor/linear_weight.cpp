#include "linear_weight.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <optional>

#include "strata/common/check.h"
#include "strata/model/dequantize.h"
#include "strata/model/model_source.h"

namespace strata::executor {
namespace {

constexpr int64_t kGroup = model::kInt4CodeGroup;

bool stored_as_floats(const std::string& storage) {
  return storage == "F32" || storage == "F16" || storage == "BF16";
}

// Codes [rows, cols] uint8 and the per-32 maps [rows, cols / 32] float32 of 4-bit weights,
// stacked by rows.
struct Int4Rows {
  at::Tensor codes, scale, offset;
};

// Rows [rows.begin, rows.end) of t (all of them when the range is empty).
at::Tensor take_rows(const at::Tensor& t, const IndexRange& rows) {
  return rows.size() > 0 ? t.narrow(0, rows.begin, rows.size()) : t;
}

// Columns [cols.begin, cols.end) / `unit` of t (all of them when the range is empty).
at::Tensor take_cols(const at::Tensor& t, const IndexRange& cols, int64_t unit = 1) {
  return cols.size() > 0 ? t.narrow(1, cols.begin / unit, cols.size() / unit).contiguous() : t;
}

IndexRange rows_of(const WeightSlice& slice, size_t i) {
  return i < slice.rows.size() ? slice.rows[i] : IndexRange{};
}

StatusOr<Int4Rows> read_int4(const model::ModelSource& source,
                             const std::vector<std::string>& names, const WeightSlice& slice) {
  std::vector<at::Tensor> codes, scale, offset;
  for (size_t i = 0; i < names.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(model::Int4Weight w, source.read_weight_int4(names[i]));
    const auto u8 = at::TensorOptions().dtype(at::kByte);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const IndexRange rows = rows_of(slice, i);
    codes.push_back(take_rows(at::from_blob(w.codes.data(), {w.rows, w.cols}, u8), rows).clone());
    scale.push_back(
        take_rows(at::from_blob(w.scale.data(), {w.rows, w.cols / kGroup}, f32), rows).clone());
    offset.push_back(
        take_rows(at::from_blob(w.offset.data(), {w.rows, w.cols / kGroup}, f32), rows).clone());
  }
  return Int4Rows{take_cols(at::cat(codes), slice.cols),
                  take_cols(at::cat(scale), slice.cols, kGroup),
                  take_cols(at::cat(offset), slice.cols, kGroup)};
}

// Symmetric int8 per row: W ~= scale[r] * q[r, :], scale the row's max |w| / 127 in bfloat16
// (q computed with the rounded scale, so that the product is what the kernel multiplies).
std::pair<at::Tensor, at::Tensor> quantize_rows_int8(const at::Tensor& w) {
  at::Tensor scale = (w.abs().amax(1) / 127.0).clamp_min(1e-30).to(at::kBFloat16);
  at::Tensor q = (w / scale.to(at::kFloat).unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
  return {q, scale};
}

// Whether any of the weights is stored quantized.
bool any_quantized(const model::ModelSource& source, const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [&](const std::string& name) {
    return !stored_as_floats(source.weight_storage(name));
  });
}

// The 4-bit codes of every name, nullopt when one is stored otherwise; other errors as they are.
StatusOr<std::optional<Int4Rows>> try_read_int4(const model::ModelSource& source,
                                                const std::vector<std::string>& names,
                                                const WeightSlice& slice) {
  if (slice.cols.begin % kGroup != 0 || slice.cols.end % kGroup != 0) {
    return std::optional<Int4Rows>();  // a column split inside a group: not as 4-bit codes
  }
  StatusOr<Int4Rows> rows = read_int4(source, names, slice);
  if (rows.ok()) return std::optional<Int4Rows>(std::move(rows).value());
  if (rows.status().code() == StatusCode::kUnimplemented) return std::optional<Int4Rows>();
  return rows.status();
}

// The slice's rows of each weight, stacked, all columns (float32 on the host).
StatusOr<at::Tensor> read_stacked_float(const model::ModelSource& source,
                                        const std::vector<std::string>& names,
                                        const WeightSlice& slice) {
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < names.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(at::Tensor part, read_weight_float(source, names[i]));
    parts.push_back(take_rows(part, rows_of(slice, i)));
  }
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts);
}

}  // namespace

StatusOr<at::Tensor> read_weight_float(const model::ModelSource& source, const std::string& name) {
  STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> shape, source.weight_shape(name));
  at::Tensor host = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  STRATA_RETURN_IF_ERROR(source.read_weight(
      name, std::span<float>(host.data_ptr<float>(), static_cast<size_t>(host.numel()))));
  return host;
}

const char* weight_form_name(WeightForm form) {
  switch (form) {
    case WeightForm::kDense:
      return "dense";
    case WeightForm::kInt4:
      return "int4";
    case WeightForm::kInt8:
      return "int8";
  }
  return "?";
}

std::optional<LinearWeight> LinearWeight::from_int4(const at::Tensor& codes,
                                                    const at::Tensor& scale,
                                                    const at::Tensor& offset,
                                                    const at::Device& device,
                                                    at::ScalarType dtype) {
  LinearWeight w;
  w.form_ = WeightForm::kInt4;
  w.dtype_ = dtype;
  if (device.is_cpu()) {
    w.weight_ = at::_convert_weight_to_int4pack_for_cpu(codes.to(at::kInt), 1);
  } else {
    const int64_t out = codes.size(0), in = codes.size(1);
    int64_t tiles = 8;
    while (tiles >= 2 && in % (tiles * 16) != 0) tiles /= 2;
    if (out % 8 != 0 || tiles < 2) return std::nullopt;
    // tinygemm's packer takes two codes a byte, element 2j in the high nibble of byte j (the
    // order of PyTorch's own int4 tests for CUDA), and packs on the device.
    const at::Tensor pairs = codes.view({out, in / 2, 2});
    const at::Tensor bytes =
        at::bitwise_or(at::bitwise_left_shift(pairs.select(2, 0), 4), pairs.select(2, 1));
    w.weight_ = at::_convert_weight_to_int4pack(bytes.contiguous().to(device), tiles);
  }
  const at::Tensor zero = offset + 8.0 * scale;
  w.scales_ = at::stack({scale.t(), zero.t()}, -1).to(device, at::kBFloat16).contiguous();
  return w;
}

LinearWeight LinearWeight::from_int8(const at::Tensor& dense, const IndexRange& cols,
                                     const at::Device& device, at::ScalarType dtype) {
  LinearWeight w;
  w.form_ = WeightForm::kInt8;
  w.dtype_ = dtype;
  // Scales of whole rows, then the columns: the same values as the unsplit weight's.
  auto [q, scale] = quantize_rows_int8(dense);
  w.weight_ = take_cols(q, cols).to(device);
  w.scales_ = scale.to(device);
  return w;
}

StatusOr<LinearWeight> LinearWeight::load(const model::ModelSource& source,
                                          const std::vector<std::string>& names,
                                          const QuantizedKernels& kernels,
                                          const at::Device& device, at::ScalarType dtype,
                                          const WeightSlice& slice) {
  if (kernels.int4) {
    STRATA_ASSIGN_OR_RETURN(std::optional<Int4Rows> rows, try_read_int4(source, names, slice));
    if (rows) {
      if (std::optional<LinearWeight> w =
              from_int4(rows->codes, rows->scale, rows->offset, device, dtype)) {
        return *std::move(w);
      }
    }
  }
  STRATA_ASSIGN_OR_RETURN(at::Tensor dense, read_stacked_float(source, names, slice));
  if (kernels.int8 && any_quantized(source, names)) {
    return from_int8(dense, slice.cols, device, dtype);
  }
  LinearWeight w;
  w.dtype_ = dtype;
  w.weight_ = take_cols(dense, slice.cols).to(device, dtype);
  return w;
}

at::Tensor LinearWeight::apply(const at::Tensor& x, const at::Tensor& bias) const {
  if (form_ == WeightForm::kDense) return at::linear(x, weight_, bias);
  const at::Tensor xb = x.to(at::kBFloat16);
  at::Tensor y;
  if (form_ == WeightForm::kInt8) {
    y = at::_weight_int8pack_mm(xb, weight_, scales_);
  } else if (x.is_cpu()) {
    y = at::_weight_int4pack_mm_for_cpu(xb, weight_, kGroup, scales_);
  } else {
    y = at::_weight_int4pack_mm(xb, weight_, kGroup, scales_);
  }
  y = y.to(dtype_);
  return bias.defined() ? y.add_(bias) : y;
}

QuantizedKernels check_quantized_kernels(const at::Device& device) {
  QuantizedKernels k;
  // A weight [64, 256] of random codes and maps, inputs of 3 rows; the reference multiplies the
  // same weight dequantized in float32 with the inputs rounded to bfloat16, as the kernels take
  // them. A kernel may differ by its bfloat16 output and its summation order (1% of the largest
  // output); a wrong layout is off by the size of the outputs.
  const at::Generator gen = at::detail::createCPUGenerator(20261126);
  const at::Tensor codes = at::randint(0, 16, {64, 256}, gen, at::kByte);
  const at::Tensor scale = at::rand({64, 256 / kGroup}, gen, at::kFloat) * 0.1 + 0.01;
  const at::Tensor offset = at::rand({64, 256 / kGroup}, gen, at::kFloat) - 0.5;
  const at::Tensor x = at::randn({3, 256}, gen, at::kFloat).to(at::kBFloat16).to(at::kFloat);
  auto agrees = [&](const LinearWeight& w, const at::Tensor& dense, const char* form) {
    try {
      const at::Tensor got = w.apply(x.to(device)).to(at::kCPU);
      const at::Tensor want = at::linear(x, dense);
      const double err = (got - want).abs().max().item<double>();
      const double bound = 0.01 * want.abs().max().item<double>();
      if (err <= bound) return true;
      k.why_not += std::string(k.why_not.empty() ? "" : "; ") + form + " kernel differs from " +
                   "at::linear by " + std::to_string(err) + " (bound " + std::to_string(bound) +
                   ")";
    } catch (const std::exception& e) {
      k.why_not += std::string(k.why_not.empty() ? "" : "; ") + form + " kernel failed: " +
                   e.what();
    }
    return false;
  };
  const at::Tensor group_scale = scale.repeat_interleave(kGroup, 1);
  const at::Tensor group_offset = offset.repeat_interleave(kGroup, 1);
  const at::Tensor zero = (offset + 8.0 * scale).to(at::kBFloat16).to(at::kFloat);
  const at::Tensor scale_b = scale.to(at::kBFloat16).to(at::kFloat);
  // What the int4 form holds: (q - 8) * scale + zero with both maps in bfloat16.
  const at::Tensor int4_dense = (codes.to(at::kFloat) - 8.0) * scale_b.repeat_interleave(kGroup, 1) +
                                zero.repeat_interleave(kGroup, 1);
  try {
    std::optional<LinearWeight> w4 = LinearWeight::from_int4(codes, scale, offset, device, at::kFloat);
    k.int4 = w4.has_value() && agrees(*w4, int4_dense, "int4");
  } catch (const std::exception& e) {
    k.why_not += std::string(k.why_not.empty() ? "" : "; ") + "int4 packing failed: " + e.what();
  }
  const at::Tensor dense = codes.to(at::kFloat) * group_scale + group_offset;
  const LinearWeight w8 = LinearWeight::from_int8(dense, {}, device, at::kFloat);
  const at::Tensor int8_dense = w8.weight_.to(at::kCPU).to(at::kFloat) *
                                w8.scales_.to(at::kCPU).to(at::kFloat).unsqueeze(1);
  k.int8 = agrees(w8, int8_dense, "int8");
  return k;
}

int64_t LinearWeight::bytes() const {
  return weight_.nbytes() + (scales_.defined() ? scales_.nbytes() : 0);
}

StatusOr<EmbeddingTable> EmbeddingTable::load(const model::ModelSource& source,
                                              const std::string& name, bool quantized,
                                              const at::Device& device, at::ScalarType dtype,
                                              IndexRange vocab) {
  EmbeddingTable t;
  t.dtype_ = dtype;
  const WeightSlice slice{{vocab}, {}};
  std::optional<Int4Rows> rows;
  if (quantized) {
    STRATA_ASSIGN_OR_RETURN(rows, try_read_int4(source, {name}, slice));
  }
  if (rows) {
    t.form_ = WeightForm::kInt4;
    // Element 2j in the low nibble of byte j, 2j + 1 in the high one.
    const at::Tensor pairs = rows->codes.view({rows->codes.size(0), -1, 2});
    t.table_ = at::bitwise_or(pairs.select(2, 0), at::bitwise_left_shift(pairs.select(2, 1), 4))
                   .contiguous()
                   .to(device);
    t.scale_ = rows->scale.to(device, at::kBFloat16);
    t.offset_ = rows->offset.to(device, at::kBFloat16);
    return t;
  }
  STRATA_ASSIGN_OR_RETURN(at::Tensor dense, read_stacked_float(source, {name}, slice));
  if (quantized && any_quantized(source, {name})) {
    t.form_ = WeightForm::kInt8;
    std::tie(t.table_, t.scale_) = quantize_rows_int8(dense);
    t.table_ = t.table_.to(device);
    t.scale_ = t.scale_.to(device);
    return t;
  }
  t.table_ = dense.to(device, dtype);
  return t;
}

EmbeddingTable EmbeddingTable::tied_to(const LinearWeight& head) {
  STRATA_CHECK(head.form_ != WeightForm::kInt4) << "a tied embedding cannot read int4-packed rows";
  EmbeddingTable t;
  t.form_ = head.form_;
  t.dtype_ = head.dtype_;
  t.tied_ = true;
  t.table_ = head.weight_;
  t.scale_ = head.scales_;
  return t;
}

at::Tensor EmbeddingTable::lookup(const at::Tensor& ids) const {
  switch (form_) {
    case WeightForm::kDense:
      return at::embedding(table_, ids);
    case WeightForm::kInt8:
      return table_.index_select(0, ids).to(dtype_) *
             scale_.index_select(0, ids).to(dtype_).unsqueeze(1);
    case WeightForm::kInt4: {
      at::Tensor packed = table_.index_select(0, ids);  // [n, H / 2]
      at::Tensor codes =
          at::stack({at::bitwise_and(packed, 15), at::bitwise_right_shift(packed, 4)}, -1)
              .view({ids.size(0), -1, kGroup})
              .to(at::kFloat);  // [n, H / 32, 32]
      at::Tensor scale = scale_.index_select(0, ids).to(at::kFloat).unsqueeze(2);
      at::Tensor offset = offset_.index_select(0, ids).to(at::kFloat).unsqueeze(2);
      return (codes * scale + offset).view({ids.size(0), -1}).to(dtype_);
    }
  }
  return {};
}

int64_t EmbeddingTable::bytes() const {
  if (tied_) return 0;
  int64_t n = table_.nbytes();
  if (scale_.defined()) n += scale_.nbytes();
  if (offset_.defined()) n += offset_.nbytes();
  return n;
}

}  // namespace strata::executor
