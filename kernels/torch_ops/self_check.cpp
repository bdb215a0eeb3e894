#include "self_check.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "strata/kernels/freekv_ops.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"

namespace strata::kernels {
namespace {

constexpr uint64_t kSeed = 20261124;

// Tolerances of the kernel tests (tests/kernels/kernel_tolerance.h).
double tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return 1e-5;
    case at::kHalf:
      return 2e-3;
    default:
      return 1.6e-2;
  }
}

std::string first_line(const char* what) {
  std::string s(what);
  return s.substr(0, s.find('\n'));
}

// Compares the two results of one op (NaN anywhere, or a different shape, is a mismatch).
OpCheck compare(KernelOp op, const at::Tensor& ours, const at::Tensor& ref, double tol) {
  OpCheck c;
  c.op = op;
  if (ours.sizes() != ref.sizes()) {
    c.detail = "shape differs from libtorch's";
  } else if (ours.isnan().any().item<bool>() || ref.isnan().any().item<bool>()) {
    c.detail = "NaN in the result";
  } else {
    const at::Tensor a = ours.to(at::kFloat), b = ref.to(at::kFloat);
    c.max_abs_diff = (a - b).abs().max().item<double>();
    if (at::allclose(a, b, tol, tol)) {
      c.result = SelfCheckResult::kPassed;
      c.backend = KernelBackend::kStrata;
      return c;
    }
    c.detail =
        "max |diff| " + std::to_string(c.max_abs_diff) + " above tolerance " + std::to_string(tol);
  }
  c.result = SelfCheckResult::kMismatch;
  c.backend = KernelBackend::kTorch;
  return c;
}

// Runs one op both ways; `run(table)` returns the op's output under that table.
template <typename Run>
OpCheck check_op(KernelOp op, const KernelOpTable& strata, const KernelOpTable& reference,
                 double tol, Run&& run) {
  at::Tensor ref;
  try {
    ref = run(reference);
  } catch (const std::exception& e) {
    OpCheck c;
    c.op = op;
    c.backend = KernelBackend::kStrata;  // nothing to compare with: keep the kernel
    c.result = SelfCheckResult::kNotRun;
    c.detail = "libtorch reference failed: " + first_line(e.what());
    return c;
  }
  try {
    return compare(op, run(strata), ref, tol);
  } catch (const std::exception& e) {
    OpCheck c;
    c.op = op;
    c.backend = KernelBackend::kTorch;
    c.result = SelfCheckResult::kMismatch;
    c.detail = "threw: " + first_line(e.what());
    return c;
  }
}

// Seeded normal values, made on the CPU (the global generator is left alone).
at::Tensor randn(at::IntArrayRef sizes, const SelfCheckShape& shape, at::Generator& gen) {
  return at::normal(0.0, 1.0, sizes, gen, at::TensorOptions().dtype(at::kFloat))
      .to(shape.device, shape.dtype);
}

struct AttentionBatch {
  at::Tensor q, kv_cache, block_tables, seq_lens, cu_q_lens;
  int64_t max_q_len = 0;
};

// Three sequences (q_len, seq_len): a decode over 70 keys, a 5-token chunk over 40, a 17-token
// prefill; blocks in shuffled order with spares.
AttentionBatch attention_batch(const SelfCheckShape& shape, at::Generator& gen) {
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{1, 70}, {5, 40}, {17, 17}};
  const int64_t bs = shape.block_size;
  std::vector<int64_t> blocks_needed;
  int64_t total_blocks = 0, num_tokens = 0, max_blocks = 0;
  AttentionBatch b;
  for (const auto& [q_len, seq_len] : seqs) {
    blocks_needed.push_back((seq_len + bs - 1) / bs);
    total_blocks += blocks_needed.back();
    max_blocks = std::max(max_blocks, blocks_needed.back());
    num_tokens += q_len;
    b.max_q_len = std::max(b.max_q_len, q_len);
  }
  const int64_t pool_blocks = total_blocks + 3;
  const at::Tensor order = at::randperm(pool_blocks, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor tables = at::zeros({static_cast<int64_t>(seqs.size()), max_blocks}, at::kInt);
  std::vector<int32_t> lens, cu = {0};
  int64_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t j = 0; j < blocks_needed[s]; ++j) {
      tables[static_cast<int64_t>(s)][j] = order[next++].item<int64_t>();
    }
    lens.push_back(static_cast<int32_t>(seqs[s].second));
    cu.push_back(cu.back() + static_cast<int32_t>(seqs[s].first));
  }
  b.q = randn({num_tokens, shape.num_heads, shape.head_dim}, shape, gen);
  b.kv_cache = randn({pool_blocks, 2, shape.num_kv_heads, bs, shape.head_dim}, shape, gen);
  b.block_tables = tables.to(shape.device);
  b.seq_lens = at::tensor(lens, at::kInt).to(shape.device);
  b.cu_q_lens = at::tensor(cu, at::kInt).to(shape.device);
  return b;
}

}  // namespace

KernelReport run_kernel_self_check(const KernelOpTable& strata, const KernelOpTable& reference,
                                   const SelfCheckShape& shape) {
  const auto start = std::chrono::steady_clock::now();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
  const double tol = tolerance(shape.dtype);
  KernelReport report;

  const at::Tensor x = randn({7, shape.hidden}, shape, gen) * 3;
  const at::Tensor weight = randn({shape.hidden}, shape, gen);
  report.ops.push_back(
      check_op(KernelOp::kRmsNorm, strata, reference, tol,
               [&](const KernelOpTable& t) { return t.rms_norm(x, weight, 1e-5); }));

  const at::Tensor positions =
      at::randint(0, 32768, {9}, gen, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor inv_freq = 1.0 / at::pow(1e4, at::arange(0, shape.head_dim, 2, at::kFloat) /
                                                     static_cast<double>(shape.head_dim));
  const at::Tensor freqs = positions.unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  const at::Tensor cos = emb.cos().to(shape.device, shape.dtype);
  const at::Tensor sin = emb.sin().to(shape.device, shape.dtype);
  const at::Tensor rx = randn({9, shape.num_heads, shape.head_dim}, shape, gen);
  report.ops.push_back(
      check_op(KernelOp::kRotary, strata, reference, tol,
               [&](const KernelOpTable& t) { return t.apply_rotary(rx, cos, sin); }));

  const AttentionBatch b = attention_batch(shape, gen);
  const double scale = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
  report.ops.push_back(
      check_op(KernelOp::kPagedAttention, strata, reference, tol, [&](const KernelOpTable& t) {
        return t.paged_attention(b.q, b.kv_cache, b.block_tables, b.seq_lens, b.cu_q_lens,
                                 b.max_q_len, scale);
      }));

  // 12 tokens into distinct random slots of the pool, the fourth one skipped (slot -1).
  const int64_t num_slots = b.kv_cache.size(0) * shape.block_size;
  at::Tensor slots =
      at::randperm(num_slots, gen, at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 12).clone();
  slots[3] = -1;
  slots = slots.to(shape.device);
  const at::Tensor key = randn({12, shape.num_kv_heads, shape.head_dim}, shape, gen);
  const at::Tensor value = randn({12, shape.num_kv_heads, shape.head_dim}, shape, gen);
  report.ops.push_back(
      check_op(KernelOp::kReshapeAndCache, strata, reference, 0.0, [&](const KernelOpTable& t) {
        at::Tensor pool = b.kv_cache.clone();
        t.reshape_and_cache(pool, key, value, slots);
        return pool;
      }));

  // Five KV blocks in KIVI-2 (the store's most compressed codec) decoded into the pool's dtype,
  // and five of the pool's dtype encoded in KIVI-4 (the store's codec on the way out).
  const kv::KvFormat kivi = kv::kivi_format(2);
  const at::Tensor packed =
      aten::pack_kv_blocks(
          randn({5, 2, shape.num_kv_heads, shape.block_size, shape.head_dim}, shape, gen).cpu(),
          kivi)
          .to(shape.device);
  report.ops.push_back(
      check_op(KernelOp::kUnpackKvBlocks, strata, reference, tol, [&](const KernelOpTable& t) {
        return t.unpack_kv_blocks(packed, kivi, shape.num_kv_heads, shape.block_size,
                                  shape.head_dim, shape.dtype);
      }));
  const at::Tensor raw =
      randn({5, 2, shape.num_kv_heads, shape.block_size, shape.head_dim}, shape, gen);
  report.ops.push_back(
      check_op(KernelOp::kPackKvBlocks, strata, reference, 0.0,
               [&](const KernelOpTable& t) { return t.pack_kv_blocks(raw, kv::kivi_format(4)); }));

  // FreeKV: 40 pages of 16 tokens, the top 8 per KV head.
  const int64_t pages = 40, p = 16, kv = shape.num_kv_heads, d = shape.head_dim;
  const at::Tensor fq = randn({shape.num_heads, d}, shape, gen);
  const auto [kmin, kmax] = aten::freekv_summaries(randn({pages, kv, p, d}, shape, gen) * 2);
  report.ops.push_back(
      check_op(KernelOp::kFreeKvSelect, strata, reference, 0.0,
               [&](const KernelOpTable& t) { return t.freekv_select(fq, kmin, kmax, 8, scale); }));
  // A page offloaded from its rows, then recalled with two other chunks and a delta.
  const at::Tensor rows_k = randn({p, kv, d}, shape, gen), rows_v = randn({p, kv, d}, shape, gen);
  const at::Tensor staged = randn({2, 2, p, d}, shape, gen);
  const at::Tensor from_k = randn({4, p, kv, d}, shape, gen),
                   from_v = randn({4, p, kv, d}, shape, gen);
  std::vector<int32_t> flat = {0, 3, 0, 0, 1, -4};  // {head, slot, source}
  for (int32_t m = 0; m < kv; ++m) flat.insert(flat.end(), {m, 0, 2 + m});
  if (kv > 1) flat.insert(flat.end(), {1, 2, 1});
  const at::Tensor items = at::tensor(flat, at::kInt).view({-1, 3}).to(shape.device);
  report.ops.push_back(
      check_op(KernelOp::kFreeKvPages, strata, reference, 0.0, [&](const KernelOpTable& t) {
        at::Tensor page = at::zeros({kv, 2, p, d}, rows_k.options());
        at::Tensor lo = at::zeros({kv, d}, rows_k.options()), hi = at::zeros_like(lo);
        t.freekv_offload(rows_k, rows_v, page, lo, hi);
        at::Tensor cache_k = at::zeros_like(from_k), cache_v = at::zeros_like(from_v);
        t.freekv_recall(at::cat({staged, page}), items, cache_k, cache_v, from_k, from_v);
        return at::cat(
            {page.flatten(), lo.flatten(), hi.flatten(), cache_k.flatten(), cache_v.flatten()});
      }));
  // A decode step: 20 resident tokens, 0, 1, 2, ... of 3 recalled pages per KV head.
  const at::Tensor resident_k = randn({20, kv, d}, shape, gen);
  const at::Tensor resident_v = randn({20, kv, d}, shape, gen);
  const at::Tensor recalled = (at::arange(kv, at::kLong) % 4).to(shape.device);
  report.ops.push_back(
      check_op(KernelOp::kFreeKvAttention, strata, reference, tol, [&](const KernelOpTable& t) {
        return t.freekv_attention(fq, resident_k, resident_v, from_k.narrow(0, 0, 3),
                                  from_v.narrow(0, 0, 3), recalled, scale);
      }));

  // Krul: decode rows of 5 layers for two sequences (70 and 9 keys) added to accumulators that
  // hold earlier steps; the totals (sum minus compensation) compared.
  const int64_t layers = 5, heads = shape.num_heads;
  const auto options = at::TensorOptions().dtype(at::kFloat).device(shape.device);
  const at::Tensor lengths = at::tensor(std::vector<int64_t>{70, 9}, at::kLong).to(shape.device);
  at::Tensor rows = at::zeros({2, layers, heads, 72}, options);
  for (int64_t s = 0; s < 2; ++s) {
    const int64_t len = s == 0 ? 70 : 9;
    rows[s].narrow(2, 0, len).copy_(
        at::softmax(randn({layers, heads, len}, shape, gen).to(at::kFloat) * 3, -1));
  }
  at::Tensor squared0 = at::zeros({2, layers, layers, heads, 2}, options);
  squared0.select(-1, 0).copy_(randn({2, layers, layers, heads}, shape, gen).abs());
  const at::Tensor edge0 = at::zeros({2, layers, 2}, options);
  report.ops.push_back(
      check_op(KernelOp::kKrulAccumulateRows, strata, reference, 1e-4, [&](const KernelOpTable& t) {
        at::Tensor squared = squared0.clone(), edge = edge0.clone();
        t.krul_accumulate_rows(rows, lengths, squared, edge);
        const auto total = [](const at::Tensor& acc) {
          return (acc.select(-1, 0) - acc.select(-1, 1)).flatten();
        };
        return at::cat({total(squared), total(edge)});
      }));

  report.self_check_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace strata::kernels
