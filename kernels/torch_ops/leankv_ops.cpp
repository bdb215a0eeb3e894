#include "strata/kernels/leankv_ops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "strata/kernels/aten_ops.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/kv/leankv_policy.h"

namespace strata::kernels::aten {
namespace {

using kv::leankv::PageFormat;
using kv::leankv::PageSegments;
using kv::leankv::Precision;

kv::TensorFormat token_format(int32_t bits, int64_t head_dim) {
  const DType dtype = bits == 8 ? DType::kInt8 : bits == 4 ? DType::kInt4 : DType::kInt2;
  return {dtype, kv::Grouping::kPerToken, static_cast<int32_t>(head_dim)};
}

// Flat byte indices into the pool of a [n, width]-byte segment whose token rows start at
// page * page_bytes + offset + slot * width.
at::Tensor row_indices(const at::Tensor& page, const at::Tensor& slot, int64_t page_bytes,
                       int64_t offset, int64_t width) {
  const at::Tensor start = page * page_bytes + offset + slot * width;
  return start.unsqueeze(1) + at::arange(width, page.options());
}

// Flat byte indices of n tokens' chunked data: chunk c of the token at `slot` lies at
// offset + (c * T + slot) * C. Returns [n, data_bytes] in the token's byte order.
at::Tensor data_indices(const at::Tensor& page, const at::Tensor& slot, int64_t page_bytes,
                        int64_t offset, int64_t tokens, int64_t chunk, int64_t data_bytes) {
  const at::Tensor chunks = at::arange(data_bytes / chunk, page.options());
  const at::Tensor start = (page * page_bytes + offset).view({-1, 1, 1}) +
                           ((chunks.view({1, -1, 1}) * tokens + slot.view({-1, 1, 1})) * chunk);
  return (start + at::arange(chunk, page.options()).view({1, 1, -1})).reshape({page.size(0), -1});
}

// One tensor (K or V) of n tokens, quantized per token: data [n, d*bits/8] and params [n, 4]
// (fp16 scale, fp16 zero) as bytes.
std::pair<at::Tensor, at::Tensor> quantize(const at::Tensor& x, int32_t bits) {
  const int64_t n = x.size(0), d = x.size(1);
  const kv::TensorFormat f = token_format(bits, d);
  const kv::TensorLayout layout = kv::tensor_layout(f, 1, n, d);
  const at::Tensor bytes = pack_kv(x.unsqueeze(0), f);
  const at::Tensor data = bytes.slice(0, 0, layout.data_bytes).view({n, -1});
  const at::Tensor scale = bytes.slice(0, layout.scales_offset, layout.scales_offset + 2 * n);
  const at::Tensor zero = bytes.slice(0, layout.zeros_offset, layout.zeros_offset + 2 * n);
  return {data, at::cat({scale.view({n, 2}), zero.view({n, 2})}, 1)};
}

at::Tensor dequantize(const at::Tensor& data, const at::Tensor& params, int32_t bits, int64_t d) {
  const int64_t n = data.size(0);
  const kv::TensorFormat f = token_format(bits, d);
  const kv::TensorLayout layout = kv::tensor_layout(f, 1, n, d);
  at::Tensor bytes = at::zeros({layout.total_bytes}, data.options());
  bytes.slice(0, 0, layout.data_bytes).copy_(data.reshape({-1}));
  bytes.slice(0, layout.scales_offset, layout.scales_offset + 2 * n)
      .copy_(params.slice(1, 0, 2).reshape({-1}));
  bytes.slice(0, layout.zeros_offset, layout.zeros_offset + 2 * n)
      .copy_(params.slice(1, 2, 4).reshape({-1}));
  return unpack_kv(bytes, f, 1, n, d).squeeze(0);
}

// A 1-D tensor's elements as byte rows [n, element size].
at::Tensor as_bytes(const at::Tensor& t) {
  return t.contiguous().view(at::kByte).view({t.size(0), static_cast<int64_t>(t.element_size())});
}

// Rows of width bytes of the pool at flat byte indices idx [n, width], as [n, width] bytes.
at::Tensor take_rows(const at::Tensor& pool, const at::Tensor& idx) {
  return pool.view({-1}).index_select(0, idx.reshape({-1})).view(idx.sizes());
}

void write_acc(at::Tensor& pool, const PageFormat& format, Precision precision,
               const at::Tensor& page, const at::Tensor& slot, const at::Tensor& acc) {
  const at::Tensor idx =
      row_indices(page, slot, format.page_bytes(), format.segments(precision).scores, 4);
  pool.view({-1}).index_put_({idx.reshape({-1})}, as_bytes(acc.to(at::kFloat)).reshape({-1}));
}

}  // namespace

at::Tensor leankv_prompt_scores(const at::Tensor& q, const at::Tensor& k, double scale) {
  const int64_t n = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  return std::get<0>(
      attention_received(q, k, 0, scale).view({kv_heads, heads / kv_heads, n}).max(1));
}

void leankv_write_tokens(at::Tensor& pool, const PageFormat& format, Precision precision,
                         const at::Tensor& page, const at::Tensor& slot, const at::Tensor& key,
                         const at::Tensor& value, const at::Tensor& acc,
                         const at::Tensor& position) {
  if (page.numel() == 0) return;
  const PageSegments& s = format.segments(precision);
  const kv::leankv::PrecisionBits& bits = format.bits(precision);
  const int64_t pb = format.page_bytes();
  at::Tensor flat = pool.view({-1});
  auto put = [&](const at::Tensor& idx, const at::Tensor& bytes) {
    flat.index_put_({idx.reshape({-1})}, bytes.reshape({-1}));
  };
  const auto [key_data, key_params] = quantize(key, bits.key);
  const auto [value_data, value_params] = quantize(value, bits.value);
  put(data_indices(page, slot, pb, s.key_data, s.tokens, s.key_chunk, key_data.size(1)), key_data);
  put(row_indices(page, slot, pb, s.key_params, 4), key_params);
  put(data_indices(page, slot, pb, s.value_data, s.tokens, s.value_chunk, value_data.size(1)),
      value_data);
  put(row_indices(page, slot, pb, s.value_params, 4), value_params);
  put(row_indices(page, slot, pb, s.scores, 4), as_bytes(acc.to(at::kFloat)));
  put(row_indices(page, slot, pb, s.positions, 4), as_bytes(position.to(at::kInt)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> leankv_read_tokens(
    const at::Tensor& pool, const PageFormat& format, Precision precision, const at::Tensor& page,
    const at::Tensor& slot) {
  const PageSegments& s = format.segments(precision);
  const kv::leankv::PrecisionBits& bits = format.bits(precision);
  const int64_t pb = format.page_bytes(), d = format.head_dim(), n = page.size(0);
  if (n == 0) {
    const at::TensorOptions options = pool.options();
    return {at::empty({0, d}, options.dtype(at::kFloat)),
            at::empty({0, d}, options.dtype(at::kFloat)), at::empty({0}, options.dtype(at::kFloat)),
            at::empty({0}, options.dtype(at::kInt))};
  }
  auto take = [&](const at::Tensor& idx) { return take_rows(pool, idx); };
  at::Tensor key = dequantize(
      take(data_indices(page, slot, pb, s.key_data, s.tokens, s.key_chunk, d * bits.key / 8)),
      take(row_indices(page, slot, pb, s.key_params, 4)), bits.key, d);
  at::Tensor value = dequantize(
      take(data_indices(page, slot, pb, s.value_data, s.tokens, s.value_chunk, d * bits.value / 8)),
      take(row_indices(page, slot, pb, s.value_params, 4)), bits.value, d);
  at::Tensor acc = take(row_indices(page, slot, pb, s.scores, 4)).view(at::kFloat).view({n});
  at::Tensor position = take(row_indices(page, slot, pb, s.positions, 4)).view(at::kInt).view({n});
  return {key, value, acc, position};
}

std::pair<at::Tensor, at::Tensor> leankv_token_slots(const PageFormat& format, Precision precision,
                                                     const at::Tensor& tables,
                                                     const at::Tensor& token_counts,
                                                     const at::Tensor& entries) {
  const at::Tensor e = entries.to(tables.device(), at::kLong).reshape({-1});
  const at::Tensor n = token_counts.to(tables.device())
                           .index_select(0, e)
                           .select(1, static_cast<int64_t>(precision))
                           .to(at::kLong);
  const at::Tensor entry_of = at::repeat_interleave(e, n);
  const at::Tensor i = at::arange(entry_of.size(0), e.options()) -
                       at::repeat_interleave(at::cumsum(n, 0) - n, n);  // index in its entry
  const int64_t per_page = format.tokens_per_page(precision), w = tables.size(1);
  const at::Tensor column =
      precision == Precision::kHigh ? i.div(per_page, "floor") : (w - 1) - i.div(per_page, "floor");
  return {tables.reshape({-1}).index_select(0, entry_of * w + column).to(at::kLong),
          i.remainder(per_page)};
}

at::Tensor leankv_decode_attention(const at::Tensor& q, at::Tensor& pool, const PageFormat& format,
                                   const at::Tensor& tables, const at::Tensor& token_counts,
                                   const at::Tensor& entries, const at::Tensor& window,
                                   const at::Tensor& window_lens, at::Tensor& window_acc,
                                   double scale) {
  // Every (sequence, KV head) of the layer at once: its tokens (high, then low, then window) are
  // one row of a padded [rows, width] layout, attended by its query-head group in one batched
  // matmul; padding is masked out.
  const int64_t num_seqs = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = entries.size(1);
  const int64_t group = heads / kv_heads, rows = num_seqs * kv_heads;
  const int64_t capacity = window.size(3);
  const at::TensorOptions longs = pool.options().dtype(at::kLong);
  const at::Tensor counts = token_counts.to(at::kCPU, at::kLong);
  const at::Tensor entry_ids = entries.to(at::kCPU, at::kLong).reshape({-1});
  const at::Tensor lens = window_lens.to(at::kCPU, at::kLong);
  const int64_t* count = counts.data_ptr<int64_t>();
  const int64_t* entry = entry_ids.data_ptr<int64_t>();
  // Per row: tokens of each section; the row's width is their sum.
  std::vector<int64_t> section_counts[3], width(rows);
  for (int64_t r = 0; r < rows; ++r) {
    section_counts[0].push_back(count[2 * entry[r]]);
    section_counts[1].push_back(count[2 * entry[r] + 1]);
    section_counts[2].push_back(lens.data_ptr<int64_t>()[r / kv_heads]);
    width[r] = section_counts[0][r] + section_counts[1][r] + section_counts[2][r];
  }
  const int64_t max_width = *std::max_element(width.begin(), width.end());
  // Token `index` of section s of row `row` sits at row * max_width + (the row's tokens of
  // earlier sections) + index.
  struct Placed {
    at::Tensor row, index, flat;
  };
  auto place = [&](int s) {
    std::vector<int64_t> before(rows, 0);
    for (int t = 0; t < s; ++t) {
      for (int64_t r = 0; r < rows; ++r) before[r] += section_counts[t][r];
    }
    const at::Tensor n = at::tensor(section_counts[s], at::kLong).to(pool.device());
    const at::Tensor row = at::repeat_interleave(at::arange(rows, longs), n);
    const at::Tensor index =
        at::arange(row.size(0), longs) - at::repeat_interleave(at::cumsum(n, 0) - n, n);
    const at::Tensor row_before =
        at::tensor(before, at::kLong).to(pool.device()).index_select(0, row);
    return Placed{row, index, row * max_width + row_before + index};
  };
  at::Tensor keys = at::zeros({rows * max_width, d}, q.options().dtype(at::kFloat));
  at::Tensor values = at::zeros_like(keys);
  at::Tensor valid = at::zeros({rows * max_width}, q.options().dtype(at::kBool));
  struct Section {
    at::Tensor page, slot, acc, flat;  // flat: index into the padded layout
  } sections[2];
  const at::Tensor row_entries = entry_ids.to(pool.device());
  for (Precision p : {Precision::kHigh, Precision::kLow}) {
    Section& section = sections[static_cast<int>(p)];
    std::tie(section.page, section.slot) =
        leankv_token_slots(format, p, tables, token_counts, row_entries);
    section.flat = place(static_cast<int>(p)).flat;
    auto [key, value, acc, position] =
        leankv_read_tokens(pool, format, p, section.page, section.slot);
    keys.index_copy_(0, section.flat, key);
    values.index_copy_(0, section.flat, value);
    section.acc = acc;
  }
  const Placed window_tokens = place(2);
  const at::Tensor& window_at = window_tokens.flat;
  const at::Tensor window_source =
      window_tokens.row * capacity + window_tokens.index;  // into [rows * capacity]
  keys.index_copy_(0, window_at,
                   window.select(1, 0)
                       .reshape({rows * capacity, d})
                       .index_select(0, window_source)
                       .to(at::kFloat));
  values.index_copy_(0, window_at,
                     window.select(1, 1)
                         .reshape({rows * capacity, d})
                         .index_select(0, window_source)
                         .to(at::kFloat));
  for (const at::Tensor& flat : {sections[0].flat, sections[1].flat, window_at}) {
    valid.index_fill_(0, flat, true);
  }

  const at::Tensor qg = q.to(at::kFloat).reshape({rows, group, d});
  const at::Tensor logits =
      at::bmm(qg, keys.view({rows, max_width, d}).transpose(1, 2))
          .mul(scale)
          .masked_fill(valid.logical_not().view({rows, 1, max_width}), -INFINITY);
  const at::Tensor probs = at::softmax(logits, -1);  // [rows, group, max_width]
  const at::Tensor out = at::bmm(probs, values.view({rows, max_width, d}));
  const at::Tensor received = std::get<0>(probs.max(1)).reshape({-1});
  for (Precision p : {Precision::kHigh, Precision::kLow}) {
    const Section& section = sections[static_cast<int>(p)];
    if (section.page.numel() == 0) continue;
    write_acc(pool, format, p, section.page, section.slot,
              section.acc + received.index_select(0, section.flat));
  }
  window_acc.copy_(window_acc.reshape({-1})
                       .index_add(0, window_source, received.index_select(0, window_at))
                       .view(window_acc.sizes()));
  return out.view({num_seqs, heads, d}).to(q.scalar_type());
}

std::pair<at::Tensor, at::Tensor> leankv_settle_plan(
    const at::Tensor& pool, const PageFormat& format, const at::Tensor& tables,
    const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
    const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds) {
  const int64_t pb = format.page_bytes();
  const at::Tensor length = lengths.to(pool.device(), at::kLong);
  const at::Tensor counts =
      token_counts.index_select(0, entries.to(token_counts.device(), at::kLong))
          .to(at::kCPU, at::kLong)
          .contiguous();
  // Every stored token's score, per precision, entry after entry (leankv_token_slots' order).
  at::Tensor scores[2];
  for (const Precision p : {Precision::kHigh, Precision::kLow}) {
    const auto [page, slot] = leankv_token_slots(format, p, tables, token_counts, entries);
    const PageSegments& s = format.segments(p);
    const at::Tensor acc =
        take_rows(pool, row_indices(page, slot, pb, s.scores, 4)).view(at::kFloat);
    const at::Tensor position =
        take_rows(pool, row_indices(page, slot, pb, s.positions, 4)).view(at::kInt);
    const at::Tensor length_of =
        at::repeat_interleave(length, counts.select(1, static_cast<int64_t>(p)).to(pool.device()));
    const at::Tensor later = (length_of - 1 - position.view({-1}).to(at::kLong)).to(at::kFloat);
    scores[static_cast<int>(p)] = (acc.view({-1}) / later).to(at::kCPU).contiguous();
  }
  const auto [actions, amounts] =
      leankv_settle_actions(format, counts, scores, length.to(at::kCPU), candidate, thresholds);
  return {actions.to(entries.device()), amounts.to(entries.device())};
}

std::pair<at::Tensor, at::Tensor> leankv_settle_actions(const PageFormat& format,
                                                        const at::Tensor& counts,
                                                        const at::Tensor (&scores)[2],
                                                        const at::Tensor& lengths,
                                                        const at::Tensor& candidate,
                                                        const kv::leankv::Thresholds& thresholds) {
  const int64_t m = counts.size(0);
  const at::Tensor length_host = lengths.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor candidate_host = candidate.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor actions = at::empty({m, 3}, at::kInt), amounts = at::zeros({m, 2}, at::kInt);
  int64_t offset[2] = {0, 0};
  for (int64_t i = 0; i < m; ++i) {
    std::span<const float> tier[2];
    int64_t n[2];
    for (int p = 0; p < 2; ++p) {
      n[p] = counts.data_ptr<int64_t>()[2 * i + p];
      tier[p] = {scores[p].data_ptr<float>() + offset[p], static_cast<size_t>(n[p])};
      offset[p] += n[p];
    }
    const kv::leankv::DecodeAction a =
        kv::leankv::decode_step(candidate_host.data_ptr<float>()[i], tier[0], tier[1],
                                length_host.data_ptr<int64_t>()[i], thresholds);
    int32_t* act = actions.data_ptr<int32_t>() + 3 * i;
    act[0] = static_cast<int32_t>(a.candidate);
    act[1] = a.victim;
    act[2] = static_cast<int32_t>(a.victim_to);
    if (a.candidate == kv::leankv::Tier::kPruned) continue;
    // The section that takes a token: the candidate's without a victim, the low one for a
    // demoted victim (a pruned victim's cell is taken by the candidate).
    int grows = -1;
    if (a.victim < 0) grows = a.candidate == kv::leankv::Tier::kHigh ? 0 : 1;
    if (a.victim >= 0 && a.victim_to == kv::leankv::Tier::kLow) grows = 1;
    if (grows >= 0 && n[grows] % format.tokens_per_page(static_cast<Precision>(grows)) == 0) {
      amounts.data_ptr<int32_t>()[2 * i + grows] = 1;
    }
  }
  return {actions, amounts};
}

void leankv_settle_apply(at::Tensor& pool, const PageFormat& format, const at::Tensor& tables,
                         at::Tensor& token_counts, const at::Tensor& entries,
                         const at::Tensor& actions, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& acc, const at::Tensor& position) {
  const int64_t m = entries.size(0), w = tables.size(1);
  if (m == 0) return;
  const at::Tensor table = tables.to(at::kCPU, at::kInt).contiguous();
  at::Tensor counts = token_counts.to(at::kCPU, at::kInt).contiguous();
  const at::Tensor entry = entries.to(at::kCPU, at::kInt).contiguous();
  const at::Tensor act = actions.to(at::kCPU, at::kInt).contiguous();
  auto cell = [&](int32_t e, Precision p, int64_t i) {
    const int64_t per_page = format.tokens_per_page(p);
    const int64_t column = p == Precision::kHigh ? i / per_page : w - 1 - i / per_page;
    return std::pair<int64_t, int64_t>{table.data_ptr<int32_t>()[e * w + column], i % per_page};
  };
  // Demoted victims are read before any candidate takes their cells.
  std::vector<int64_t> victim_page, victim_slot;
  for (int64_t i = 0; i < m; ++i) {
    const int32_t* a = act.data_ptr<int32_t>() + 3 * i;
    if (a[1] < 0 || a[2] != static_cast<int32_t>(kv::leankv::Tier::kLow)) continue;
    const auto [page, slot] = cell(entry.data_ptr<int32_t>()[i], Precision::kHigh, a[1]);
    victim_page.push_back(page);
    victim_slot.push_back(slot);
  }
  const auto [victim_k, victim_v, victim_acc, victim_position] = leankv_read_tokens(
      pool, format, Precision::kHigh, at::tensor(victim_page, at::kLong).to(pool.device()),
      at::tensor(victim_slot, at::kLong).to(pool.device()));
  // Per precision: the cells written, and which rows: candidate i (>= 0) or victim -1 - j.
  std::vector<int64_t> page[2], slot[2], row[2];
  int64_t victim = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int32_t* a = act.data_ptr<int32_t>() + 3 * i;
    if (a[0] == static_cast<int32_t>(kv::leankv::Tier::kPruned)) continue;
    const int32_t e = entry.data_ptr<int32_t>()[i];
    int32_t* count = counts.data_ptr<int32_t>() + 2 * e;
    const int to = a[0];
    const auto target = a[1] >= 0 ? cell(e, static_cast<Precision>(to), a[1])
                                  : cell(e, static_cast<Precision>(to), count[to]++);
    page[to].push_back(target.first);
    slot[to].push_back(target.second);
    row[to].push_back(i);
    if (a[1] >= 0 && a[2] == static_cast<int32_t>(kv::leankv::Tier::kLow)) {
      const auto moved = cell(e, Precision::kLow, count[1]++);
      page[1].push_back(moved.first);
      slot[1].push_back(moved.second);
      row[1].push_back(-1 - victim++);
    }
  }
  // Candidates' rows and victims' rows side by side (float32: exact for every input dtype).
  const at::Tensor rows_k = at::cat({key.to(at::kFloat), victim_k});
  const at::Tensor rows_v = at::cat({value.to(at::kFloat), victim_v});
  const at::Tensor rows_acc = at::cat({acc.to(at::kFloat), victim_acc});
  const at::Tensor rows_position = at::cat({position.to(at::kInt), victim_position});
  for (const Precision p : {Precision::kHigh, Precision::kLow}) {
    const int q = static_cast<int>(p);
    if (page[q].empty()) continue;
    std::vector<int64_t> index;
    for (const int64_t r : row[q]) index.push_back(r >= 0 ? r : m + (-1 - r));
    const at::Tensor rows = at::tensor(index, at::kLong).to(pool.device());
    leankv_write_tokens(pool, format, p, at::tensor(page[q], at::kLong).to(pool.device()),
                        at::tensor(slot[q], at::kLong).to(pool.device()),
                        rows_k.index_select(0, rows), rows_v.index_select(0, rows),
                        rows_acc.index_select(0, rows), rows_position.index_select(0, rows));
  }
  if (!counts.is_same(token_counts)) token_counts.copy_(counts);
}

}  // namespace strata::kernels::aten
