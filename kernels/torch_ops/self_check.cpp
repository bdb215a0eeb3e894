#include "self_check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "strata/kernels/freekv_ops.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/kernels/leankv_ops.h"

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

// LeanKV: two sequences' entries (one per KV head) compressed into K8V4 / K4V2 pages of 16 tokens
// (each allocates as if every token were high, keeps one high and one low page, and its tokens are
// written), then a decode step over them: attention over the pages and a window (compared within
// the dtype's tolerance), and Algorithm 1's plan, the step's pages and the apply (the pool's
// bytes, the page manager's state, the counts and the actions compared exactly).
OpCheck check_leankv(const KernelOpTable& strata, const KernelOpTable& reference,
                     const SelfCheckShape& shape, at::Generator& gen, double tol) {
  using kv::leankv::Precision;
  const int64_t kv = shape.num_kv_heads, d = shape.head_dim, seqs = 2, n = seqs * kv;
  const StatusOr<kv::leankv::PageFormat> format =
      kv::leankv::PageFormat::create(d, {8, 4}, {4, 2}, 16);
  if (!format.ok()) {
    OpCheck c;
    c.op = KernelOp::kLeanKv;
    c.detail = "LeanKV's pages refuse this head_dim: " + format.status().message();
    return c;
  }
  const kv::leankv::PageFormat& f = *format;
  const auto on = [&](at::ScalarType t) {
    return at::TensorOptions().dtype(t).device(shape.device);
  };
  const int64_t pages = 4 * n + 8, width = 6, capacity = 8,
                t_low = f.tokens_per_page(Precision::kLow);
  std::vector<int32_t> conservative, keep, counts_of;
  for (int64_t e = 0; e < n; ++e) {
    conservative.insert(conservative.end(), {static_cast<int32_t>(2 + e % 2), 0});
    keep.insert(keep.end(), {1, 1});
    counts_of.insert(counts_of.end(), {static_cast<int32_t>(5 + e % 11),
                                       static_cast<int32_t>(std::min<int64_t>(3 + e % 13, t_low))});
  }
  const at::Tensor entries = at::arange(n, on(at::kInt));
  const at::Tensor conservative_t = at::tensor(conservative, at::kInt).to(shape.device);
  const at::Tensor keep_t = at::tensor(keep, at::kInt).to(shape.device);
  const at::Tensor token_counts = at::tensor(counts_of, at::kInt).view({n, 2}).to(shape.device);
  at::Tensor rows[2][4];  // per precision: key, value, acc, position
  for (int p = 0; p < 2; ++p) {
    const int64_t m = token_counts.select(1, p).sum().item<int64_t>();
    rows[p][0] = randn({m, d}, shape, gen) * 2;
    rows[p][1] = randn({m, d}, shape, gen);
    rows[p][2] = randn({m}, shape, gen).to(at::kFloat).abs();
    rows[p][3] = at::randint(0, 90, {m}, gen, at::TensorOptions().dtype(at::kInt)).to(shape.device);
  }
  const at::Tensor q = randn({seqs, shape.num_heads, d}, shape, gen);
  const at::Tensor window = randn({seqs, 2, kv, capacity, d}, shape, gen);
  const at::Tensor window_lens = at::tensor(std::vector<int32_t>{8, 5}, at::kInt).to(shape.device);
  const at::Tensor window_acc0 = randn({seqs, kv, capacity}, shape, gen).to(at::kFloat).abs();
  const at::Tensor lengths =
      at::tensor(std::vector<int64_t>{120, 100}, at::kLong).repeat_interleave(kv).to(shape.device);
  const at::Tensor candidate =
      (randn({n}, shape, gen).to(at::kFloat).abs() / 60.0).to(shape.device);
  const at::Tensor ckey = randn({n, d}, shape, gen), cvalue = randn({n, d}, shape, gen);
  const at::Tensor cacc = randn({n}, shape, gen).to(at::kFloat).abs();
  const at::Tensor cposition = (lengths - 9).to(at::kInt);
  const kv::leankv::Thresholds thresholds{1.0, 0.1, static_cast<int32_t>(capacity)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const int64_t max_tokens = f.tokens_per_page(Precision::kHigh) + t_low + capacity;

  // The attention and the accumulators it adds to (state = false: within the tolerance, so the
  // pool's accumulators it changes are not compared), or the state after the decode step's
  // Algorithm 1 on the pages as written (exact).
  const auto run = [&](const KernelOpTable& t, bool state) {
    at::Tensor ring = at::arange(pages, on(at::kInt));
    at::Tensor counters = at::tensor(std::vector<int64_t>{0, pages, 0}, at::kLong).to(shape.device);
    at::Tensor tables = at::full({n, width}, -1, on(at::kInt)),
               counts = at::zeros({n, 2}, on(at::kInt));
    t.leankv_pages(LeanKvPageOp::kAllocate, ring, counters, tables, counts, entries,
                   conservative_t);
    t.leankv_pages(LeanKvPageOp::kSplit, ring, counters, tables, counts, entries, keep_t);
    at::Tensor pool = at::zeros({pages, f.page_bytes()}, on(at::kByte));
    for (const Precision p : {Precision::kHigh, Precision::kLow}) {
      const auto [page, slot] = aten::leankv_token_slots(f, p, tables, token_counts, entries);
      const at::Tensor* r = rows[static_cast<int>(p)];
      t.leankv_write_tokens(pool, f, p, page, slot, r[0], r[1], r[2], r[3]);
    }
    if (!state) {
      at::Tensor window_acc = window_acc0.clone();
      const at::Tensor out =
          t.leankv_decode_attention(q, pool, f, tables, token_counts, entries.view({seqs, kv}),
                                    window, window_lens, window_acc, max_tokens, scale);
      return at::cat({out.flatten().to(at::kFloat), window_acc.flatten()});
    }
    at::Tensor step_counts = token_counts.clone();
    const auto [actions, amounts] =
        t.leankv_settle_plan(pool, f, tables, step_counts, entries, lengths, candidate, thresholds);
    t.leankv_pages(LeanKvPageOp::kAllocate, ring, counters, tables, counts, entries, amounts);
    t.leankv_settle_apply(pool, f, tables, step_counts, entries, actions, ckey, cvalue, cacc,
                          cposition);
    return at::cat({pool.flatten().to(at::kLong), ring.to(at::kLong), counters,
                    tables.flatten().to(at::kLong), counts.flatten().to(at::kLong),
                    step_counts.flatten().to(at::kLong), actions.flatten().to(at::kLong)});
  };
  const OpCheck attention = check_op(KernelOp::kLeanKv, strata, reference, tol,
                                     [&](const KernelOpTable& t) { return run(t, false); });
  const OpCheck step = check_op(KernelOp::kLeanKv, strata, reference, 0.0,
                                [&](const KernelOpTable& t) { return run(t, true); });
  return attention.result == SelfCheckResult::kPassed ? step : attention;
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

  report.ops.push_back(check_leankv(strata, reference, shape, gen, tol));

  report.self_check_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace strata::kernels
