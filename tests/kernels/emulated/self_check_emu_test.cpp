// The start-up self-check (kernels/torch_ops/self_check.h) in CI: Strata's kernels under the
// block emulator against the libtorch implementations (aten_ops.h), through the same code the
// executor runs on a GPU; then a wrong, a throwing and a NaN-producing kernel each fall back to
// libtorch while the other ops keep Strata's kernel.

#include <gtest/gtest.h>

#include <stdexcept>

#include "emulated_ops.h"
#include "self_check.h"
#include "strata/kernels/aten_ops.h"
#include "strata/kernels/freekv_ops.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/kernels/leankv_ops.h"
#include "strata/kv/leankv_pages.h"

namespace strata::kernels {
namespace {

KernelOpTable libtorch_table() {
  KernelOpTable t;
  t.rms_norm = aten::rms_norm;
  t.apply_rotary = aten::apply_rotary;
  t.paged_attention = [](const at::Tensor& q, const at::Tensor& kv, const at::Tensor& tables,
                         const at::Tensor& lens, const at::Tensor& cu, int64_t /*max_q_len*/,
                         double scale) {
    at::Tensor out = at::empty_like(q);
    aten::paged_attention(out, q, kv, tables, lens, cu, scale);
    return out;
  };
  t.reshape_and_cache = aten::reshape_and_cache;
  t.unpack_kv_blocks = [](const at::Tensor& bytes, const kv::KvFormat& format, int64_t h, int64_t b,
                          int64_t d, at::ScalarType dtype) {
    return aten::unpack_kv_blocks(bytes, format, h, b, d).to(dtype);
  };
  t.pack_kv_blocks = aten::pack_kv_blocks;
  t.freekv_select = aten::freekv_select;
  t.freekv_offload = aten::freekv_offload;
  t.freekv_recall = aten::freekv_recall;
  t.freekv_attention = aten::freekv_attention;
  t.krul_accumulate_rows = aten::krul_accumulate_rows;
  t.leankv_pages = [](LeanKvPageOp op, at::Tensor& ring, at::Tensor& counters, at::Tensor& tables,
                      at::Tensor& counts, const at::Tensor& entries, const at::Tensor& amounts) {
    const kv::leankv::PageManagerState state = testing::page_state(ring, counters, tables, counts);
    const kv::leankv::PageBatch batch = testing::page_batch(entries, amounts);
    if (op == LeanKvPageOp::kAllocate) kv::leankv::allocate_pages(state, batch);
    if (op == LeanKvPageOp::kRelease) kv::leankv::release_pages(state, batch);
    if (op == LeanKvPageOp::kSplit) kv::leankv::split_pages(state, batch);
  };
  t.leankv_write_tokens = aten::leankv_write_tokens;
  t.leankv_decode_attention = [](const at::Tensor& q, at::Tensor& pool,
                                 const kv::leankv::PageFormat& format, const at::Tensor& tables,
                                 const at::Tensor& token_counts, const at::Tensor& entries,
                                 const at::Tensor& window, const at::Tensor& window_lens,
                                 at::Tensor& window_acc, int64_t /*max_tokens*/, double scale) {
    return aten::leankv_decode_attention(q, pool, format, tables, token_counts, entries, window,
                                         window_lens, window_acc, scale);
  };
  t.leankv_settle_plan = aten::leankv_settle_plan;
  t.leankv_settle_apply = aten::leankv_settle_apply;
  return t;
}

// SmolLM2-135M (9 heads over 3 kv heads of 64) in bf16, and a Qwen2.5-1.5B-like shape (12 over
// 2 of 128) in fp16.
SelfCheckShape smollm2_shape() { return {576, 9, 3, 64, 16, at::kBFloat16, at::kCPU}; }
SelfCheckShape qwen_shape() { return {1536, 12, 2, 128, 16, at::kHalf, at::kCPU}; }

const OpCheck& check_of(const KernelReport& r, KernelOp op) {
  for (const OpCheck& c : r.ops) {
    if (c.op == op) return c;
  }
  throw std::logic_error("op missing from the report");
}

TEST(KernelSelfCheck, EmulatedKernelsMatchLibtorch) {
  for (const SelfCheckShape& shape : {smollm2_shape(), qwen_shape()}) {
    const KernelReport r =
        run_kernel_self_check(testing::emulated_kernel_table(), libtorch_table(), shape);
    ASSERT_EQ(r.ops.size(), static_cast<size_t>(kNumKernelOps));
    for (KernelOp op : kAllKernelOps) {
      const OpCheck& c = check_of(r, op);
      SCOPED_TRACE(kernel_op_name(op));
      EXPECT_EQ(c.result, SelfCheckResult::kPassed) << c.detail;
      EXPECT_EQ(c.backend, KernelBackend::kStrata);
    }
    EXPECT_EQ(check_of(r, KernelOp::kReshapeAndCache).max_abs_diff, 0.0);
    EXPECT_GT(r.self_check_seconds, 0.0);
  }
}

TEST(KernelSelfCheck, AWrongKernelFallsBackToLibtorch) {
  KernelOpTable broken = testing::emulated_kernel_table();
  broken.rms_norm = [](const at::Tensor& x, const at::Tensor& w, double eps) {
    return testing::emulated_rms_norm(x, w, eps) * 1.05;  // 5% off: beyond bf16 tolerance
  };
  broken.paged_attention = [](const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, int64_t, double) -> at::Tensor {
    throw std::runtime_error("illegal memory access\nsecond line");
  };
  broken.apply_rotary = [](const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    at::Tensor out = testing::emulated_rotary(x, cos, sin);
    out.view(-1)[0] = NAN;
    return out;
  };
  broken.freekv_select = [](const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                            int64_t top_k, double scale) {
    return testing::emulated_freekv_select(q, kmin, kmax, top_k + 1, scale)  // one page more
        .narrow(1, 1, top_k);
  };
  // A decode step that forgets to write its tokens.
  broken.leankv_settle_apply = [](at::Tensor&, const kv::leankv::PageFormat&, const at::Tensor&,
                                  at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&) {};
  const KernelReport r = run_kernel_self_check(broken, libtorch_table(), smollm2_shape());
  const OpCheck& norm = check_of(r, KernelOp::kRmsNorm);
  EXPECT_EQ(norm.result, SelfCheckResult::kMismatch);
  EXPECT_EQ(norm.backend, KernelBackend::kTorch);
  EXPECT_GT(norm.max_abs_diff, 0.0);
  EXPECT_NE(norm.detail.find("above tolerance"), std::string::npos) << norm.detail;
  const OpCheck& rotary = check_of(r, KernelOp::kRotary);
  EXPECT_EQ(rotary.backend, KernelBackend::kTorch);
  EXPECT_EQ(rotary.detail, "NaN in the result");
  const OpCheck& attention = check_of(r, KernelOp::kPagedAttention);
  EXPECT_EQ(attention.backend, KernelBackend::kTorch);
  EXPECT_EQ(attention.detail, "threw: illegal memory access");
  const OpCheck& cache = check_of(r, KernelOp::kReshapeAndCache);
  EXPECT_EQ(cache.result, SelfCheckResult::kPassed);
  EXPECT_EQ(r.backend(KernelOp::kRmsNorm), KernelBackend::kTorch);
  EXPECT_EQ(r.backend(KernelOp::kReshapeAndCache), KernelBackend::kStrata);
  EXPECT_EQ(r.backend(KernelOp::kFreeKvSelect), KernelBackend::kTorch);
  EXPECT_EQ(r.backend(KernelOp::kFreeKvAttention), KernelBackend::kStrata);
  EXPECT_EQ(check_of(r, KernelOp::kLeanKv).result, SelfCheckResult::kMismatch);
  EXPECT_EQ(r.backend(KernelOp::kLeanKv), KernelBackend::kTorch);
}

}  // namespace
}  // namespace strata::kernels
