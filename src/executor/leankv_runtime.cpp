#include "leankv_runtime.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <new>
#include <numeric>
#include <string>

#include "strata/common/check.h"
#include "strata/kernels/aten_ops.h"
#include "strata/kernels/leankv_ops.h"

namespace strata::executor {
namespace {

using kv::leankv::Precision;
using kv::leankv::Tier;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

at::Tensor long_tensor(const std::vector<int64_t>& values) {
  return at::tensor(values, at::TensorOptions().dtype(at::kLong));
}

// One precision's token writes of a step, gathered for one leankv_write_tokens call: cells, and
// rows in batches (keys and values [r, D], accumulators [r] float32, positions [r] int32).
struct Writes {
  std::vector<int64_t> page, slot;
  std::vector<at::Tensor> key, value, acc, position;

  void flush(at::Tensor& pages, const kv::leankv::PageFormat& format, Precision precision) const {
    if (page.empty()) return;
    kernels::aten::leankv_write_tokens(pages, format, precision, long_tensor(page),
                                       long_tensor(slot), at::cat(key), at::cat(value),
                                       at::cat(acc).to(at::kFloat), at::cat(position).to(at::kInt));
  }
};

}  // namespace

StatusOr<LeanKvRuntime> LeanKvRuntime::create(const LeanKvConfig& config,
                                              const model::ModelConfig& model,
                                              at::ScalarType dtype) {
  STRATA_ASSIGN_OR_RETURN(
      kv::leankv::PageFormat format,
      kv::leankv::PageFormat::create(model.head_dim, {config.high_key_bits, config.high_value_bits},
                                     {config.low_key_bits, config.low_value_bits},
                                     config.high_tokens_per_page));
  if (config.window < 1 || config.max_sequences < 1) {
    return invalid_argument_error("leankv: window and max_sequences must be at least 1");
  }
  LeanKvRuntime r;
  r.config_ = config;
  r.thresholds_ = {config.alpha_high, config.alpha_low, config.window};
  r.format_ = format;
  r.num_layers_ = model.num_layers;
  r.num_heads_ = model.num_heads;
  r.num_kv_heads_ = model.num_kv_heads;
  r.head_dim_ = model.head_dim;
  r.capacity_ = config.window + 1;
  r.dtype_ = dtype;
  // The prompt's conservative allocation takes one page more than its tokens divide into, and
  // two partly filled sections at most two more (docs/leankv.md, decision 8).
  r.width_ = ceil_div(model.max_context_tokens, format.tokens_per_page(Precision::kHigh)) + 2;
  const int64_t num_pages = std::max<int64_t>(1, config.pool_bytes / format.page_bytes());
  const int64_t entries = config.max_sequences * r.num_layers_ * r.num_kv_heads_;
  try {
    const auto i32 = at::TensorOptions().dtype(at::kInt);
    r.pages_ = at::zeros({num_pages, format.page_bytes()}, at::kByte);
    r.ring_ = at::empty({num_pages}, i32);
    r.counters_ = at::empty({kv::leankv::kNumCounters}, at::kLong);
    r.tables_ = at::empty({entries, r.width_}, i32);
    r.page_counts_ = at::empty({entries, 2}, i32);
    r.token_counts_ = at::zeros({entries, 2}, i32);
    r.window_ = at::zeros(
        {r.num_layers_, config.max_sequences, 2, r.num_kv_heads_, r.capacity_, r.head_dim_}, dtype);
    r.window_acc_ =
        at::zeros({r.num_layers_, config.max_sequences, r.num_kv_heads_, r.capacity_}, at::kFloat);
  } catch (const std::bad_alloc&) {
    return resource_exhausted_error("leankv: cannot allocate " + std::to_string(config.pool_bytes) +
                                    " bytes of pages");
  }
  kv::leankv::init_pages(r.manager());
  for (int32_t s = config.max_sequences - 1; s >= 0; --s) r.free_slots_.push_back(s);
  return r;
}

kv::leankv::PageManagerState LeanKvRuntime::manager() {
  return {ring_.data_ptr<int32_t>(),
          counters_.data_ptr<int64_t>(),
          tables_.data_ptr<int32_t>(),
          page_counts_.data_ptr<int32_t>(),
          ring_.size(0),
          tables_.size(0),
          width_};
}

bool LeanKvRuntime::decoding(SeqId seq) const { return slots_.contains(seq); }

std::pair<int64_t, int64_t> LeanKvRuntime::token_cell(int32_t entry, Precision p, int64_t i) const {
  const int64_t per_page = format_.tokens_per_page(p);
  const int64_t column = p == Precision::kHigh ? i / per_page : width_ - 1 - i / per_page;
  return {tables_.data_ptr<int32_t>()[entry * width_ + column], i % per_page};
}

void LeanKvRuntime::observe_prompt(SeqId seq, int64_t layer, const at::Tensor& q,
                                   const at::Tensor& keys, int64_t start, double scale) {
  if (start == 0 && layer == 0) {
    end(seq);
    prompt_sums_[seq].assign(num_layers_, at::Tensor());
  }
  auto found = prompt_sums_.find(seq);
  if (found == prompt_sums_.end()) return;  // not computed from position 0 under LeanKV
  at::Tensor received = kernels::aten::attention_received(q, keys, start, scale);
  at::Tensor& sums = found->second[layer];
  if (sums.defined()) received.narrow(1, 0, sums.size(1)) += sums;
  sums = received;
}

Status LeanKvRuntime::compress(
    SeqId seq, int64_t n, const std::function<std::pair<at::Tensor, at::Tensor>(int64_t)>& kv_of) {
  auto sums = prompt_sums_.find(seq);
  STRATA_CHECK(sums != prompt_sums_.end()) << "sequence " << seq.value << ": no prompt observed";
  if (free_slots_.empty()) {
    prompt_sums_.erase(sums);
    ++ended_.failed_prompts;
    return resource_exhausted_error("leankv: all " + std::to_string(config_.max_sequences) +
                                    " sequence slots are in use");
  }
  const int32_t slot = free_slots_.back();
  const int64_t group = num_heads_ / num_kv_heads_;
  const int64_t kept_window = std::min<int64_t>(n, config_.window);
  const int64_t stored = n - kept_window;
  const int64_t t_high = format_.tokens_per_page(Precision::kHigh);
  const int64_t t_low = format_.tokens_per_page(Precision::kLow);

  // Tiers of every (layer, head), from the max over the group of each query head's sums.
  std::vector<std::vector<int64_t>> high(num_layers_ * num_kv_heads_), low(high.size());
  std::vector<at::Tensor> accs(num_layers_);  // [Hkv, n]
  int64_t pruned = 0;
  for (int64_t l = 0; l < num_layers_; ++l) {
    accs[l] = std::get<0>(sums->second[l].view({num_kv_heads_, group, n}).max(1)).contiguous();
    const at::Tensor later = (n - 1 - at::arange(n, at::kFloat)).clamp_min(1);
    const at::Tensor scores = (accs[l] / later).contiguous();
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      std::vector<Tier> tiers(n);
      kv::leankv::prompt_tiers({scores[h].data_ptr<float>(), static_cast<size_t>(n)}, thresholds_,
                               tiers);
      for (int64_t p = 0; p < stored; ++p) {
        if (tiers[p] == Tier::kHigh) high[l * num_kv_heads_ + h].push_back(p);
        if (tiers[p] == Tier::kLow) low[l * num_kv_heads_ + h].push_back(p);
        if (tiers[p] == Tier::kPruned) ++pruned;
      }
    }
  }

  // The paper's prompt workflow: every entry allocates as if all its tokens were high (one page
  // of slack for the rounding of two sections), then keeps the pages its tiers fill.
  std::vector<int32_t> entries, conservative, keep;
  for (int64_t l = 0; l < num_layers_; ++l) {
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      const size_t i = l * num_kv_heads_ + h;
      entries.push_back(entry(slot, l, h));
      conservative.push_back(stored == 0 ? 0 : static_cast<int32_t>(ceil_div(stored, t_high) + 1));
      conservative.push_back(0);
      keep.push_back(static_cast<int32_t>(ceil_div(std::ssize(high[i]), t_high)));
      keep.push_back(static_cast<int32_t>(ceil_div(std::ssize(low[i]), t_low)));
    }
  }
  const int64_t count = std::ssize(entries);
  // Pages stay free for the next decode step of every decoding sequence, this one included (at
  // most a page per entry), so that the step after compression cannot run out.
  int64_t reserve = count;
  for (const auto& [other, unused] : slots_) reserve += step_pages(other);
  const int64_t kept = std::accumulate(keep.begin(), keep.end(), int64_t{0});
  if (kept + reserve > free_pages()) {
    prompt_sums_.erase(sums);
    ++ended_.failed_prompts;
    return resource_exhausted_error("leankv: a prompt of " + std::to_string(n) + " tokens needs " +
                                    std::to_string(kept) + " pages and " + std::to_string(reserve) +
                                    " stay reserved for decode steps; " +
                                    std::to_string(free_pages()) + " are free");
  }
  kv::leankv::allocate_pages(manager(), {entries.data(), conservative.data(), count});
  if (const int64_t short_by = shortfall(); short_by > 0) {
    prompt_sums_.erase(sums);
    ++ended_.failed_prompts;
    return resource_exhausted_error("leankv: the page pool lacks " + std::to_string(short_by) +
                                    " pages for a prompt of " + std::to_string(n) + " tokens");
  }
  kv::leankv::split_pages(manager(), {entries.data(), keep.data(), count});
  free_slots_.pop_back();
  slots_[seq] = slot;

  const at::Tensor window_positions = at::arange(stored, n, at::kLong);
  for (int64_t l = 0; l < num_layers_; ++l) {
    const auto [keys, values] = kv_of(l);  // [n, Hkv, D]
    Writes writes[2];
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      const int32_t e = entry(slot, l, h);
      const size_t i = l * num_kv_heads_ + h;
      for (const Precision p : {Precision::kHigh, Precision::kLow}) {
        const std::vector<int64_t>& tokens = p == Precision::kHigh ? high[i] : low[i];
        if (tokens.empty()) continue;
        const at::Tensor rows = long_tensor(tokens);
        Writes& w = writes[static_cast<int>(p)];
        for (size_t t = 0; t < tokens.size(); ++t) {
          const auto [page, cell] = token_cell(e, p, static_cast<int64_t>(t));
          w.page.push_back(page);
          w.slot.push_back(cell);
        }
        w.key.push_back(keys.select(1, h).index_select(0, rows));
        w.value.push_back(values.select(1, h).index_select(0, rows));
        w.acc.push_back(accs[l][h].index_select(0, rows));
        w.position.push_back(rows);
      }
      token_counts_.data_ptr<int32_t>()[2 * e] = static_cast<int32_t>(high[i].size());
      token_counts_.data_ptr<int32_t>()[2 * e + 1] = static_cast<int32_t>(low[i].size());
    }
    writes[0].flush(pages_, format_, Precision::kHigh);
    writes[1].flush(pages_, format_, Precision::kLow);
    const at::Tensor cells = window_positions.remainder(capacity_);
    at::Tensor window = window_[l][slot];  // [2, Hkv, capacity, D]
    window[0].index_copy_(1, cells,
                          keys.narrow(0, stored, kept_window).permute({1, 0, 2}).to(dtype_));
    window[1].index_copy_(1, cells,
                          values.narrow(0, stored, kept_window).permute({1, 0, 2}).to(dtype_));
    window_acc_[l][slot].index_copy_(1, cells, accs[l].narrow(1, stored, kept_window));
  }
  pruned_[seq] = pruned;
  lengths_[seq] = n;
  prompt_sums_.erase(sums);
  return Status();
}

at::Tensor LeanKvRuntime::attend(std::span<const SeqId> seqs, std::span<const int64_t> positions,
                                 int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, double scale) {
  const int64_t m = std::ssize(seqs);
  std::vector<int64_t> slot_list;
  std::vector<int32_t> lens, entries;
  for (int64_t i = 0; i < m; ++i) {
    const int32_t slot = slots_.at(seqs[i]);
    const int64_t cell = positions[i] % capacity_;
    lengths_[seqs[i]] = positions[i] + 1;
    at::Tensor window = window_[layer][slot];
    window[0].select(1, cell).copy_(k[i]);
    window[1].select(1, cell).copy_(v[i]);
    window_acc_[layer][slot].select(1, cell).zero_();
    slot_list.push_back(slot);
    lens.push_back(static_cast<int32_t>(std::min(positions[i] + 1, capacity_)));
    for (int64_t h = 0; h < num_kv_heads_; ++h) entries.push_back(entry(slot, layer, h));
  }
  const at::Tensor slot_index = long_tensor(slot_list);
  const at::Tensor window = window_[layer].index_select(0, slot_index);
  at::Tensor window_acc = window_acc_[layer].index_select(0, slot_index);
  const at::Tensor out =
      kernels::aten::leankv_decode_attention(q, pages_, format_, tables_, token_counts_,
                                             at::tensor(entries, at::kInt).view({m, num_kv_heads_}),
                                             window, at::tensor(lens, at::kInt), window_acc, scale);
  window_acc_[layer].index_copy_(0, slot_index, window_acc);
  return out;
}

Status LeanKvRuntime::settle(std::span<const SeqId> seqs, std::span<const int64_t> positions,
                             int64_t layer) {
  // The entries whose window a token leaves, and that token (the candidate) in the window.
  std::vector<int32_t> entries, candidates;
  std::vector<int64_t> lengths, acc_cells, key_rows, value_rows;
  std::vector<size_t> seq_of;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (positions[i] + 1 <= config_.window) continue;  // nobody leaves the window yet
    const int32_t slot = slots_.at(seqs[i]);
    const int64_t candidate = positions[i] - config_.window, cell = candidate % capacity_;
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      entries.push_back(entry(slot, layer, h));
      candidates.push_back(static_cast<int32_t>(candidate));
      lengths.push_back(positions[i] + 1);
      acc_cells.push_back((slot * num_kv_heads_ + h) * capacity_ + cell);
      key_rows.push_back(((slot * 2 + 0) * num_kv_heads_ + h) * capacity_ + cell);
      value_rows.push_back(((slot * 2 + 1) * num_kv_heads_ + h) * capacity_ + cell);
      seq_of.push_back(i);
    }
  }
  if (entries.empty()) return Status();
  const int64_t m = std::ssize(entries);
  const at::Tensor entry_ids = at::tensor(entries, at::kInt);
  const at::Tensor acc = window_acc_[layer].view({-1}).index_select(0, long_tensor(acc_cells));
  const at::Tensor score = acc / at::full_like(acc, static_cast<float>(config_.window));
  const auto [actions, amounts] = kernels::aten::leankv_settle_plan(
      pages_, format_, tables_, token_counts_, entry_ids, long_tensor(lengths), score, thresholds_);
  const int32_t* action = actions.data_ptr<int32_t>();
  for (int64_t i = 0; i < m; ++i) {
    const bool candidate_pruned = action[3 * i] == static_cast<int32_t>(Tier::kPruned);
    const bool victim_pruned =
        action[3 * i + 1] >= 0 && action[3 * i + 2] == static_cast<int32_t>(Tier::kPruned);
    pruned_[seqs[seq_of[i]]] += candidate_pruned + victim_pruned;
  }
  kv::leankv::allocate_pages(manager(), {entries.data(), amounts.data_ptr<int32_t>(), m});
  if (const int64_t short_by = shortfall(); short_by > 0) {
    return resource_exhausted_error("leankv: the page pool lacks " + std::to_string(short_by) +
                                    " pages for a decode step");
  }
  const at::Tensor rows = window_[layer].view({-1, head_dim_});
  kernels::aten::leankv_settle_apply(pages_, format_, tables_, token_counts_, entry_ids, actions,
                                     rows.index_select(0, long_tensor(key_rows)),
                                     rows.index_select(0, long_tensor(value_rows)), acc,
                                     at::tensor(candidates, at::kInt));
  return Status();
}

void LeanKvRuntime::end(SeqId seq) {
  prompt_sums_.erase(seq);
  auto it = slots_.find(seq);
  if (it == slots_.end()) {
    pruned_.erase(seq);
    return;
  }
  std::vector<int32_t> entries, amounts;
  const int32_t* page_counts = page_counts_.data_ptr<int32_t>();
  int32_t* token_counts = token_counts_.data_ptr<int32_t>();
  const int64_t heads = num_layers_ * num_kv_heads_;
  const int64_t window = std::min<int64_t>(lengths_[seq], config_.window) * heads;
  int64_t high = 0, low = 0;
  for (int64_t l = 0; l < num_layers_; ++l) {
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      const int32_t e = entry(it->second, l, h);
      entries.push_back(e);
      amounts.push_back(page_counts[2 * e]);
      amounts.push_back(page_counts[2 * e + 1]);
      high += token_counts[2 * e];
      low += token_counts[2 * e + 1];
      token_counts[2 * e] = token_counts[2 * e + 1] = 0;
    }
  }
  // Bytes of K and V: data, scales and zeros (the 8-byte accumulator and position aside).
  const int64_t bf16_token = 2 * head_dim_ * 2;
  ++ended_.ended_sequences;
  ended_.ended_high += high;
  ended_.ended_low += low;
  ended_.ended_pruned += pruned_[seq];
  ended_.ended_window += window;
  ended_.ended_bytes += high * (format_.token_bytes(Precision::kHigh) - 8) +
                        low * (format_.token_bytes(Precision::kLow) - 8) +
                        window * 2 * head_dim_ * static_cast<int64_t>(c10::elementSize(dtype_));
  ended_.ended_bf16_bytes += (high + low + pruned_[seq] + window) * bf16_token;
  pruned_.erase(seq);
  lengths_.erase(seq);
  kv::leankv::release_pages(manager(), {entries.data(), amounts.data(), std::ssize(entries)});
  free_slots_.push_back(it->second);
  slots_.erase(it);
}

int64_t LeanKvRuntime::step_pages(SeqId seq) const {
  auto it = slots_.find(seq);
  if (it == slots_.end()) return 0;
  const int32_t* page_counts = page_counts_.data_ptr<int32_t>();
  const int32_t* token_counts = token_counts_.data_ptr<int32_t>();
  const int64_t per_page[2] = {format_.tokens_per_page(Precision::kHigh),
                               format_.tokens_per_page(Precision::kLow)};
  int64_t pages = 0;
  for (int64_t l = 0; l < num_layers_; ++l) {
    for (int64_t h = 0; h < num_kv_heads_; ++h) {
      const int32_t e = entry(it->second, l, h);
      bool full = false;
      for (int s = 0; s < 2; ++s) {
        full |= token_counts[2 * e + s] >= page_counts[2 * e + s] * per_page[s];
      }
      pages += full ? 1 : 0;
    }
  }
  return pages;
}

LeanKvCounts LeanKvRuntime::counts() const {
  LeanKvCounts c = ended_;
  const int32_t* token_counts = token_counts_.data_ptr<int32_t>();
  for (const auto& [seq, slot] : slots_) {
    for (int64_t l = 0; l < num_layers_; ++l) {
      for (int64_t h = 0; h < num_kv_heads_; ++h) {
        const int32_t e = entry(slot, l, h);
        c.high += token_counts[2 * e];
        c.low += token_counts[2 * e + 1];
      }
    }
  }
  for (const auto& [seq, pruned] : pruned_) c.pruned += pruned;
  c.num_pages = ring_.size(0);
  c.pages_used = c.num_pages - free_pages();
  return c;
}

}  // namespace strata::executor
