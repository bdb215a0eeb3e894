// The executor in every compute dtype on every available device, with weights dequantized or kept
// quantized, against its own fp32 CPU run on dequantized weights (which executor_reference_test
// ties to HF transformers). fp32 on CUDA must match closely; bf16, fp16 and quantized weights
// (bfloat16 activations into the matmuls, an int8-requantized head; libtorch's CPU or CUDA
// weight-only kernels) must keep the distribution:
// cosine similarity of the logits and the same argmax on steps where fp32's top-2 gap is clear.
// CUDA cases skip without a device.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "linear_weight.h"
#include "paged_runner.h"
#include "strata/executor/executor.h"
#include "strata/model/model_source.h"

namespace strata::executor {
namespace {

struct GreedyRun {
  std::vector<float> prompt_logits;  // [vocab] at the last prompt position
  std::vector<TokenId> greedy;       // 16 greedy tokens
  std::vector<double> top2_gaps;     // fp32 only: top-2 gap at each greedy step
};

GreedyRun run(const model::ModelSource& source, const ExecutorOptions& options,
        const std::vector<TokenId>& prompt, const std::vector<TokenId>* forced = nullptr) {
  StatusOr<std::unique_ptr<Executor>> executor = Executor::create(source, options);
  EXPECT_TRUE(executor.ok()) << executor.status().to_string();
  if (!executor.ok()) return {};
  testing::PagedRunner runner(**executor);
  std::vector<TokenId> next = prompt;
  GreedyRun r;
  for (int step = 0; step < 16; ++step) {
    StatusOr<ForwardResult> out = runner.run({{SeqId{1}, next, LogitsMode::kLast}});
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return r;
    const std::vector<float>& logits = out->logits;
    if (step == 0) r.prompt_logits = logits;
    std::vector<float> sorted(logits);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    r.top2_gaps.push_back(sorted[0] - sorted[1]);
    r.greedy.push_back(
        static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    // Follow the reference's tokens (when given) so every step is comparable.
    next = {forced ? (*forced)[step] : r.greedy.back()};
  }
  return r;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
}

class ExecutorDtypeTest
    : public ::testing::TestWithParam<std::tuple<DeviceKind, DType, WeightStorage>> {};

TEST_P(ExecutorDtypeTest, AgreesWithFp32Cpu) {
  const auto [device, dtype, weights] = GetParam();
  if (device == DeviceKind::kCuda && c10::cuda::device_count() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  StatusOr<std::unique_ptr<model::ModelSource>> source =
      model::open_model_source(STRATA_TEST_MODEL);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  std::vector<TokenId> prompt;
  for (int i = 0; i < 96; ++i) prompt.push_back(static_cast<TokenId>(100 + (i * 7919) % 20000));

  const GreedyRun reference = run(**source, ExecutorOptions{}, prompt);
  ExecutorOptions options;
  options.device = {device, 0};
  options.dtype = dtype;
  options.weights = weights;
  const GreedyRun ours = run(**source, options, prompt, &reference.greedy);
  ASSERT_EQ(ours.greedy.size(), reference.greedy.size());

  const bool exact = dtype == DType::kFloat32 && weights == WeightStorage::kDequantize;
  EXPECT_GT(cosine(ours.prompt_logits, reference.prompt_logits), exact ? 0.99999 : 0.995);
  // Reduced precision may flip only steps whose fp32 top-2 gap is small.
  const double clear_gap = exact ? 1e-3 : 0.5;
  for (size_t i = 0; i < ours.greedy.size(); ++i) {
    if (reference.top2_gaps[i] > clear_gap) {
      EXPECT_EQ(ours.greedy[i], reference.greedy[i]) << "step " << i << ", fp32 top-2 gap "
                                                      << reference.top2_gaps[i];
    }
  }
}

constexpr WeightStorage kDequantize = WeightStorage::kDequantize;
constexpr WeightStorage kQuantized = WeightStorage::kQuantized;
INSTANTIATE_TEST_SUITE_P(
    Grid, ExecutorDtypeTest,
    ::testing::Values(std::make_tuple(DeviceKind::kCpu, DType::kBFloat16, kDequantize),
                      std::make_tuple(DeviceKind::kCpu, DType::kFloat16, kDequantize),
                      std::make_tuple(DeviceKind::kCpu, DType::kFloat32, kQuantized),
                      std::make_tuple(DeviceKind::kCpu, DType::kBFloat16, kQuantized),
                      std::make_tuple(DeviceKind::kCuda, DType::kFloat32, kDequantize),
                      std::make_tuple(DeviceKind::kCuda, DType::kBFloat16, kDequantize),
                      std::make_tuple(DeviceKind::kCuda, DType::kFloat16, kDequantize),
                      std::make_tuple(DeviceKind::kCuda, DType::kBFloat16, kQuantized),
                      std::make_tuple(DeviceKind::kCuda, DType::kFloat16, kQuantized)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == DeviceKind::kCpu ? "cpu_" : "cuda_") +
             dtype_name(std::get<1>(info.param)) +
             (std::get<2>(info.param) == kQuantized ? "_quantized" : "");
    });

// The start-up check of libtorch's int4 and int8 weight-only kernels (linear_weight.h) passes
// on every device present: a wrong packing (nibble order, tile count, maps) fails it, and the
// weights would then serve dense.
TEST(QuantizedWeightsTest, KernelsPassTheirStartUpCheck) {
  std::vector<at::Device> devices = {at::Device(at::kCPU)};
  if (c10::cuda::device_count() > 0) devices.emplace_back(at::kCUDA, 0);
  for (const at::Device& device : devices) {
    const QuantizedKernels k = check_quantized_kernels(device);
    EXPECT_TRUE(k.int4) << device << ": " << k.why_not;
    EXPECT_TRUE(k.int8) << device << ": " << k.why_not;
  }
}

// A form the start-up check left out: a 4-bit weight takes the int8 form, and with neither form
// the dense one, with the same products up to each form's rounding.
TEST(QuantizedWeightsTest, AFormTheCheckLeftOutLoadsAsTheNext) {
  StatusOr<std::unique_ptr<model::ModelSource>> source =
      model::open_model_source(STRATA_TEST_MODEL);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  const std::vector<std::string> names = {"blk.0.ffn_down.weight"};  // Q4_1
  const at::Device cpu(at::kCPU);
  QuantizedKernels both{.int4 = true, .int8 = true}, int8_only{.int4 = false, .int8 = true}, none;
  const at::Tensor x = at::randn({3, 1536});
  std::vector<at::Tensor> outputs;
  for (const auto& [kernels, form] : {std::pair{both, WeightForm::kInt4},
                                      std::pair{int8_only, WeightForm::kInt8},
                                      std::pair{none, WeightForm::kDense}}) {
    StatusOr<LinearWeight> w = LinearWeight::load(**source, names, kernels, cpu, at::kFloat);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(w->form(), form) << weight_form_name(form);
    outputs.push_back(w->apply(x));
  }
  const double scale = outputs[2].abs().max().item<double>();
  EXPECT_LT((outputs[0] - outputs[2]).abs().max().item<double>(), 0.02 * scale);
  EXPECT_LT((outputs[1] - outputs[2]).abs().max().item<double>(), 0.05 * scale);
}

// The default model (Q4_1 layers, a tied Q8_0 embedding) kept quantized, on the CPU and on CUDA:
// every layer matmul on its 4-bit codes, the head requantized to int8 and the embedding reading
// the head's rows, in less memory than the file takes (the bound is 1.25x).
class QuantizedModelTest : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(QuantizedModelTest, DefaultModelKeepsItsFileSize) {
  if (GetParam() == DeviceKind::kCuda && c10::cuda::device_count() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  StatusOr<std::unique_ptr<model::ModelSource>> source =
      model::open_model_source(STRATA_TEST_MODEL);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  ExecutorOptions options;
  options.device = {GetParam(), 0};
  options.weights = WeightStorage::kQuantized;
  StatusOr<std::unique_ptr<Executor>> executor = Executor::create(**source, options);
  ASSERT_TRUE(executor.ok()) << executor.status().to_string();
  const WeightReport& r = (*executor)->weight_report();
  EXPECT_EQ(r.kernel_fallback, "");
  EXPECT_EQ(r.int4, 30 * 4);  // q/k/v fused, output, gate/up fused, down: all Q4_1
  EXPECT_EQ(r.int8, 1);       // the Q8_0 head
  EXPECT_EQ(r.dense, 0);
  EXPECT_EQ(r.embedding, "tied");
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(STRATA_TEST_MODEL));
  EXPECT_LT(r.bytes, file_bytes);

  options.weights = WeightStorage::kDequantize;
  executor = Executor::create(**source, options);
  ASSERT_TRUE(executor.ok()) << executor.status().to_string();
  EXPECT_EQ((*executor)->weight_report().dense, 30 * 4 + 1);
  // float32 on the CPU, bfloat16 on CUDA
  EXPECT_GT((*executor)->weight_report().bytes,
            (GetParam() == DeviceKind::kCpu ? 4 : 2) * file_bytes);
}

INSTANTIATE_TEST_SUITE_P(Devices, QuantizedModelTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const auto& info) {
                           return std::string(info.param == DeviceKind::kCpu ? "cpu" : "cuda");
                         });

}  // namespace
}  // namespace strata::executor
