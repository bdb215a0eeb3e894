// LeanKV's at::Tensor adapters (torch_ops.h): Strata's kernels on CUDA tensors, its CPU loop for
// the decode attention on CPU tensors (cpu_ops.h), libtorch (leankv_ops.h) and the sequential
// page manager (kv/leankv_pages.h) otherwise.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "launch_params.h"
#include "strata/kernels/cpu_ops.h"
#include "strata/kernels/leankv_ops.h"
#include "strata/kernels/ops.h"
#include "strata/kernels/torch_ops.h"
#include "strata/kv/leankv_pages.h"

namespace strata::kernels {
namespace {

using kv::leankv::PageFormat;

// Strata's kernels serve CUDA tensors unless the caller asks for libtorch.
bool on_strata(const at::Tensor& t, KernelBackend backend) {
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "supported devices are CPU and CUDA, got ", t.device());
  return t.is_cuda() && backend == KernelBackend::kStrata;
}

void check_on(const at::Tensor& t, const char* name, const at::Tensor& like, at::ScalarType dtype) {
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), ", expected ",
              like.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// Rows written into the pool: key and value [n, d] of one float dtype, acc float32, position
// int32, contiguous on the pool's device.
void check_rows(const at::Tensor& pool, const at::Tensor& key, const at::Tensor& value,
                const at::Tensor& acc, const at::Tensor& position) {
  check_on(key, "key", pool, key.scalar_type());
  check_on(value, "value", key, key.scalar_type());
  check_on(acc, "acc", pool, at::kFloat);
  check_on(position, "position", pool, at::kInt);
}

bool head_dim_served(int64_t d) { return d == 64 || d == 128; }

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

}  // namespace

void leankv_pages(LeanKvPageOp op, at::Tensor& ring, at::Tensor& counters, at::Tensor& tables,
                  at::Tensor& counts, const at::Tensor& entries, const at::Tensor& amounts,
                  KernelBackend backend) {
  check_on(ring, "ring", ring, at::kInt);
  check_on(counters, "counters", ring, at::kLong);
  check_on(tables, "tables", ring, at::kInt);
  check_on(counts, "counts", ring, at::kInt);
  check_on(entries, "entries", ring, at::kInt);
  check_on(amounts, "amounts", ring, at::kInt);
  TORCH_CHECK(amounts.numel() == 2 * entries.numel(), "leankv_pages: amounts must be [",
              entries.numel(), ", 2], got ", amounts.sizes());
  if (entries.numel() == 0) return;
  const bool device = on_strata(ring, backend);
  // The sequential implementation over host memory (copies of device tensors under kTorch).
  at::Tensor r = device ? ring : ring.cpu(), c = device ? counters : counters.cpu();
  at::Tensor t = device ? tables : tables.cpu(), n = device ? counts : counts.cpu();
  const at::Tensor e = device ? entries : entries.cpu(), a = device ? amounts : amounts.cpu();
  const kv::leankv::PageManagerState state{r.data_ptr<int32_t>(),
                                           c.data_ptr<int64_t>(),
                                           t.data_ptr<int32_t>(),
                                           n.data_ptr<int32_t>(),
                                           r.size(0),
                                           t.size(0),
                                           t.size(1)};
  const kv::leankv::PageBatch batch{e.data_ptr<int32_t>(), a.data_ptr<int32_t>(), e.numel()};
  if (device) {
    const c10::cuda::CUDAGuard guard(ring.device());
    switch (op) {
      case LeanKvPageOp::kAllocate:
        return launch_leankv_allocate(state, batch, stream_of(ring));
      case LeanKvPageOp::kRelease:
        return launch_leankv_release(state, batch, stream_of(ring));
      case LeanKvPageOp::kSplit:
        return launch_leankv_split(state, batch, stream_of(ring));
    }
  }
  switch (op) {
    case LeanKvPageOp::kAllocate:
      kv::leankv::allocate_pages(state, batch);
      break;
    case LeanKvPageOp::kRelease:
      kv::leankv::release_pages(state, batch);
      break;
    case LeanKvPageOp::kSplit:
      kv::leankv::split_pages(state, batch);
      break;
  }
  if (!ring.is_cpu()) {
    ring.copy_(r);
    counters.copy_(c);
    tables.copy_(t);
    counts.copy_(n);
  }
}

void leankv_write_tokens(at::Tensor& pool, const PageFormat& format,
                         kv::leankv::Precision precision, const at::Tensor& page,
                         const at::Tensor& slot, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& acc, const at::Tensor& position, KernelBackend backend) {
  if (!on_strata(pool, backend) || !head_dim_served(format.head_dim())) {
    return aten::leankv_write_tokens(pool, format, precision, page, slot, key, value, acc,
                                     position);
  }
  check_on(page, "page", pool, at::kLong);
  check_on(slot, "slot", pool, at::kLong);
  check_rows(pool, key, value, acc, position);
  const c10::cuda::CUDAGuard guard(pool.device());
  launch_leankv_write_tokens(
      leankv_write_params(pool, format, precision, page, slot, key, value, acc, position),
      stream_of(pool));
}

at::Tensor leankv_decode_attention(const at::Tensor& q, at::Tensor& pool, const PageFormat& format,
                                   const at::Tensor& tables, const at::Tensor& token_counts,
                                   const at::Tensor& entries, const at::Tensor& window,
                                   const at::Tensor& window_lens, at::Tensor& window_acc,
                                   int64_t max_tokens, double scale, KernelBackend backend) {
  const int64_t heads = q.size(1), kv_heads = entries.size(1);
  const bool served = on_strata(q, backend) &&
                      (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) &&
                      head_dim_served(q.size(2)) && heads % kv_heads == 0 && heads / kv_heads <= 8;
  if (!served) {
    // Strata's CPU loop reads the pages in place (the libtorch reference gathers every token).
    const bool cpu_loop = backend == KernelBackend::kStrata && q.is_cpu() && pool.is_contiguous() &&
                          window_acc.is_contiguous() &&
                          (q.scalar_type() == at::kFloat || q.scalar_type() == at::kHalf ||
                           q.scalar_type() == at::kBFloat16) &&
                          window.scalar_type() == q.scalar_type() && heads % kv_heads == 0;
    if (cpu_loop) {
      return cpu::leankv_decode_attention(
          q.contiguous(), pool, format, tables.contiguous(), token_counts.contiguous(),
          entries.contiguous(), window.contiguous(), window_lens.contiguous(), window_acc, scale);
    }
    return aten::leankv_decode_attention(q, pool, format, tables, token_counts, entries, window,
                                         window_lens, window_acc, scale);
  }
  check_on(q, "q", q, q.scalar_type());
  check_on(pool, "pool", q, at::kByte);
  check_on(tables, "tables", q, at::kInt);
  check_on(token_counts, "token_counts", q, at::kInt);
  check_on(entries, "entries", q, at::kInt);
  check_on(window, "window", q, q.scalar_type());
  check_on(window_lens, "window_lens", q, at::kInt);
  check_on(window_acc, "window_acc", q, at::kFloat);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty_like(q);
  LeanKvDecodeParams params =
      leankv_decode_params(out, q, pool, format, tables, token_counts, entries, window, window_lens,
                           window_acc, max_tokens, scale);
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(leankv_decode_workspace_bytes(params) / sizeof(float))},
                q.options().dtype(at::kFloat));
  params.workspace = workspace.data_ptr<float>();
  launch_leankv_decode_attention(params, stream_of(q));
  return out;
}

std::pair<at::Tensor, at::Tensor> leankv_settle_plan(
    const at::Tensor& pool, const PageFormat& format, const at::Tensor& tables,
    const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
    const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds, KernelBackend backend) {
  if (!on_strata(pool, backend)) {
    // Strata's CPU loop reads each token's score in place (libtorch's gathers them).
    if (backend == KernelBackend::kStrata && pool.is_cpu() && pool.is_contiguous() &&
        tables.scalar_type() == at::kInt && token_counts.scalar_type() == at::kInt &&
        entries.scalar_type() == at::kInt && lengths.scalar_type() == at::kLong &&
        candidate.scalar_type() == at::kFloat) {
      return cpu::leankv_settle_plan(pool, format, tables.contiguous(), token_counts.contiguous(),
                                     entries.contiguous(), lengths.contiguous(),
                                     candidate.contiguous(), thresholds);
    }
    return aten::leankv_settle_plan(pool, format, tables, token_counts, entries, lengths, candidate,
                                    thresholds);
  }
  check_on(tables, "tables", pool, at::kInt);
  check_on(token_counts, "token_counts", pool, at::kInt);
  check_on(entries, "entries", pool, at::kInt);
  check_on(lengths, "lengths", pool, at::kLong);
  check_on(candidate, "candidate", pool, at::kFloat);
  const c10::cuda::CUDAGuard guard(pool.device());
  const int64_t m = entries.size(0);
  at::Tensor actions = at::empty({m, 3}, entries.options());
  at::Tensor amounts = at::empty({m, 2}, entries.options());
  at::Tensor counts = token_counts;
  at::Tensor bytes = pool;
  launch_leankv_settle_plan(
      leankv_settle_params(bytes, format, tables, counts, entries, lengths, candidate, thresholds,
                           actions, amounts, {}, {}, {}, {}),
      stream_of(pool));
  return {actions, amounts};
}

void leankv_settle_apply(at::Tensor& pool, const PageFormat& format, const at::Tensor& tables,
                         at::Tensor& token_counts, const at::Tensor& entries,
                         const at::Tensor& actions, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& acc, const at::Tensor& position, KernelBackend backend) {
  if (!on_strata(pool, backend) || !head_dim_served(format.head_dim())) {
    return aten::leankv_settle_apply(pool, format, tables, token_counts, entries, actions, key,
                                     value, acc, position);
  }
  check_on(tables, "tables", pool, at::kInt);
  check_on(token_counts, "token_counts", pool, at::kInt);
  check_on(entries, "entries", pool, at::kInt);
  check_on(actions, "actions", pool, at::kInt);
  check_rows(pool, key, value, acc, position);
  const c10::cuda::CUDAGuard guard(pool.device());
  at::Tensor a = actions, none;
  launch_leankv_settle_apply(
      leankv_settle_params(pool, format, tables, token_counts, entries, {}, {},
                           kv::leankv::Thresholds{}, a, none, key, value, acc, position),
      stream_of(pool));
}

}  // namespace strata::kernels
