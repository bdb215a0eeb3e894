// Which implementation each custom op runs: Strata's kernel (CUDA, or on the CPU its host loops,
// kernels/cpu_ops.h) or libtorch's (kernels/aten_ops.h). The start-up self-check
// (kernels/self_check.h) fills a KernelReport; `executor.kernels: torch` in the config forces
// libtorch for every op. On the CPU, attention over chunks of several queries (prefill) always
// runs libtorch. Framework-free.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace strata::kernels {

enum class KernelBackend { kStrata, kTorch };

// kUnpackKvBlocks: the KV store's encoded chunks decoded into the pool (kernels::unpack_kv_blocks);
// kPackKvBlocks: raw chunks encoded for the store (kernels::pack_kv_blocks).
// kFreeKv*: FreeKV's page selection, page layout conversions (offload and recall) and decode
// attention (docs/freekv.md). kKrulAccumulateRows: Krul's decode-row statistics
// (kernels::krul_accumulate_rows, docs/krul.md). kLeanKv: LeanKV's page manager,
// quantize-on-append, decode attention and decode step (Algorithm 1), checked and chosen together
// (docs/leankv.md).
enum class KernelOp {
  kRmsNorm,
  kRotary,
  kPagedAttention,
  kReshapeAndCache,
  kUnpackKvBlocks,
  kPackKvBlocks,
  kFreeKvSelect,
  kFreeKvPages,
  kFreeKvAttention,
  kKrulAccumulateRows,
  kLeanKv
};
inline constexpr int kNumKernelOps = 11;
inline constexpr std::array<KernelOp, kNumKernelOps> kAllKernelOps = {
    KernelOp::kRmsNorm,         KernelOp::kRotary,
    KernelOp::kPagedAttention,  KernelOp::kReshapeAndCache,
    KernelOp::kUnpackKvBlocks,  KernelOp::kPackKvBlocks,
    KernelOp::kFreeKvSelect,    KernelOp::kFreeKvPages,
    KernelOp::kFreeKvAttention, KernelOp::kKrulAccumulateRows,
    KernelOp::kLeanKv};

inline const char* kernel_op_name(KernelOp op) {
  switch (op) {
    case KernelOp::kRmsNorm:
      return "rms_norm";
    case KernelOp::kRotary:
      return "rotary";
    case KernelOp::kPagedAttention:
      return "paged_attention";
    case KernelOp::kReshapeAndCache:
      return "reshape_and_cache";
    case KernelOp::kUnpackKvBlocks:
      return "unpack_kv_blocks";
    case KernelOp::kPackKvBlocks:
      return "pack_kv_blocks";
    case KernelOp::kFreeKvSelect:
      return "freekv_select";
    case KernelOp::kFreeKvPages:
      return "freekv_pages";
    case KernelOp::kFreeKvAttention:
      return "freekv_attention";
    case KernelOp::kKrulAccumulateRows:
      return "krul_accumulate_rows";
    case KernelOp::kLeanKv:
      return "leankv";
  }
  return "?";
}

inline const char* kernel_backend_name(KernelBackend backend) {
  return backend == KernelBackend::kStrata ? "strata" : "torch";
}

// The self-check's verdict on one op.
enum class SelfCheckResult {
  kPassed,    // Strata's kernel matched libtorch: it runs
  kMismatch,  // it did not (or threw): libtorch runs instead
  kNotRun,    // executor.kernels: torch
};

inline const char* self_check_result_name(SelfCheckResult r) {
  switch (r) {
    case SelfCheckResult::kPassed:
      return "passed";
    case SelfCheckResult::kMismatch:
      return "mismatch";
    case SelfCheckResult::kNotRun:
      return "not_run";
  }
  return "?";
}

struct OpCheck {
  KernelOp op = KernelOp::kRmsNorm;
  KernelBackend backend = KernelBackend::kTorch;  // what serves the op
  SelfCheckResult result = SelfCheckResult::kNotRun;
  double max_abs_diff = 0.0;  // Strata against libtorch, when both ran
  std::string detail;         // why a check failed, or why it did not run
};

// What the executor runs for each op, and why (surfaced by /health and /metrics).
struct KernelReport {
  std::vector<OpCheck> ops;  // one per KernelOp, in kAllKernelOps order
  double self_check_seconds = 0.0;
  KernelBackend backend(KernelOp op) const { return ops[static_cast<size_t>(op)].backend; }
};

}  // namespace strata::kernels
