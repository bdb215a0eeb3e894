// Weights as the matmuls read them (private to the executor): dense in the compute dtype, or kept
// quantized and multiplied by libtorch's weight-only kernels (docs/quantized-weights.md).
//
// Forms of a linear layer's weight W [out, in] (y = x W^T):
//   kDense  [out, in] in the compute dtype; at::linear.
//   kInt4   4-bit GGUF codes (Q4_0, Q4_1, Q4_K) repacked for libtorch's int4 kernel, W = (q - 8)
//           * scale + zero (zero = offset + 8 * scale of the GGUF map), bfloat16 scale_zeros
//           [in / 32, out, 2] per group of 32 along `in`. Exact but for the bfloat16 rounding of
//           scale and zero. CPU: at::_weight_int4pack_mm_for_cpu, packed uint8 [out, in / 2].
//           CUDA: at::_weight_int4pack_mm (tinygemm, sm80+), int32 [out / 8, in / (t * 16), 32,
//           t / 2] for t inner k-tiles (8, 4 or 2: the largest that divides in / 16); needs
//           out % 8 == 0, else the weight takes kInt8.
//   kInt8   any other quantized storage (Q5_x, Q6_K, Q8_0, ...) requantized per output row:
//           int8 [out, in] and bfloat16 scale [out], W = scale * q; at::_weight_int8pack_mm
//           (CPU and CUDA). Lossy (one scale per row instead of the file's per-block scales).
// The quantized kernels take bfloat16 activations (their float32 paths are 10-30x slower on the
// CPU, measured; tinygemm takes nothing else): x is converted at the boundary and y returned in
// the compute dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "strata/common/status.h"
#include "tensor_shard.h"

namespace strata::model {
class ModelSource;
}

namespace strata::executor {

// The weight `name` dequantized to float32 on the host, in its ModelSource shape.
StatusOr<at::Tensor> read_weight_float(const model::ModelSource& source, const std::string& name);

enum class WeightForm { kDense, kInt4, kInt8 };

// The quantized forms a device serves. check_quantized_kernels() multiplies a small random
// weight in each form through libtorch's kernels on `device` and compares with at::linear over the
// same weight dequantized; a form whose kernel throws (tinygemm has no code for GPUs before sm80)
// or disagrees is left out, and the weights that would take it load as the next form (int4 ->
// int8 -> dense). `why_not` says what failed, for the start-up log.
struct QuantizedKernels {
  bool int4 = false, int8 = false;
  std::string why_not;
};
QuantizedKernels check_quantized_kernels(const at::Device& device);

// The part of a weight [out, in] that a tensor-parallel rank holds (tensor_shard.h): rows
// [begin, end) of each stacked weight (all of them when `rows` is empty), then columns
// [cols.begin, cols.end) of the stack (all when cols is empty). Every form holds the same values
// as the whole weight's rows and columns: int8 rows keep their whole row's scale, and 4-bit codes
// are split at group boundaries (the form is dense when a column split is not on one).
struct WeightSlice {
  std::vector<IndexRange> rows;
  IndexRange cols;
};
const char* weight_form_name(WeightForm form);

class LinearWeight {
 public:
  LinearWeight() = default;

  // The rows of the weights `names` stacked in order (gate then up; q, k, v), all [*, in]: the
  // kInt4 form when every one is stored as 4-bit codes and `kernels` has int4 (and the device's
  // layout takes the shape), else kInt8 when any is stored quantized and `kernels` has int8,
  // else dense (`kernels` all false: `weights: dequantize`).
  static StatusOr<LinearWeight> load(const model::ModelSource& source,
                                     const std::vector<std::string>& names,
                                     const QuantizedKernels& kernels, const at::Device& device,
                                     at::ScalarType dtype, const WeightSlice& slice = {});

  // x: [M, in] in the compute dtype -> [M, out] in the compute dtype; bias [out] or undefined.
  at::Tensor apply(const at::Tensor& x, const at::Tensor& bias = {}) const;
  WeightForm form() const { return form_; }
  int64_t bytes() const;  // resident bytes of the tensors held

 private:
  friend class EmbeddingTable;  // a tied embedding reads the head's rows
  friend QuantizedKernels check_quantized_kernels(const at::Device& device);
  // The int4 form of codes [out, in] (uint8) and their per-32 maps [out, in / 32] (float32) on
  // `device`; nullopt when the device's layout does not take the shape.
  static std::optional<LinearWeight> from_int4(const at::Tensor& codes, const at::Tensor& scale,
                                               const at::Tensor& offset, const at::Device& device,
                                               at::ScalarType dtype);
  static LinearWeight from_int8(const at::Tensor& dense, const IndexRange& cols,
                                const at::Device& device, at::ScalarType dtype);
  WeightForm form_ = WeightForm::kDense;
  at::ScalarType dtype_ = at::kFloat;  // the compute dtype
  at::Tensor weight_;                  // [out, in] dense / packed int4 [out, in / 2] / int8
  at::Tensor scales_;                  // kInt4: scale_zeros [in / 32, out, 2]; kInt8: [out]
};

// The token embedding [vocab, hidden] for lookup. Dense, int8 rows with a scale per row, or
// nibble-packed 4-bit codes [vocab, hidden / 2] with a bfloat16 (scale, offset) per 32 (the
// GGUF map, exact but for that rounding), so a 4-bit file's table stays near its file size.
class EmbeddingTable {
 public:
  EmbeddingTable() = default;
  // Rows `rows` of the table (all when empty: a tensor-parallel rank's vocabulary run).
  static StatusOr<EmbeddingTable> load(const model::ModelSource& source, const std::string& name,
                                       bool quantized, const at::Device& device,
                                       at::ScalarType dtype, IndexRange rows = {});
  // Shares the rows of a tied head (REQUIRES head.form() != kInt4: its packing is opaque).
  static EmbeddingTable tied_to(const LinearWeight& head);

  at::Tensor lookup(const at::Tensor& ids) const;  // int64 [n] -> [n, hidden] compute dtype
  WeightForm form() const { return form_; }
  int64_t bytes() const;  // 0 when tied to the head (its bytes are counted there)

 private:
  WeightForm form_ = WeightForm::kDense;
  at::ScalarType dtype_ = at::kFloat;
  bool tied_ = false;          // the tensors are the head's
  at::Tensor table_;           // dense [V, H] / int8 [V, H] / packed codes [V, H / 2]
  at::Tensor scale_, offset_;  // int8: scale [V]; int4: [V, H / 32] each, bfloat16
};

}  // namespace strata::executor
