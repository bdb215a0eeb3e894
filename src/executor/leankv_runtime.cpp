#include "leankv_runtime.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "strata/common/check.h"
#include "strata/kernels/aten_ops.h"
#include "strata/kernels/leankv_ops.h"
#include "strata/kernels/torch_ops.h"

namespace strata::executor {
namespace {

using kv::leankv::Precision;
using kv::leankv::Tier;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

at::Tensor long_tensor(const std::vector<int64_t>& values) {
  return at::tensor(values, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

StatusOr<LeanKvRuntime> LeanKvRuntime::create(const LeanKvConfig& config,
                                              const model::ModelConfig& model, at::ScalarType dtype,
                                              at::Device device, kernels::KernelBackend backend) {
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
  r.backend_ = backend;
  // The prompt's conservative allocation takes one page more than its tokens divide into, and
  // two partly filled sections at most two more (docs/leankv.md, decision 8).
  r.width_ = ceil_div(model.max_context_tokens, format.tokens_per_page(Precision::kHigh)) + 2;
  const int64_t num_pages = std::max<int64_t>(1, config.pool_bytes / format.page_bytes());
  const int64_t entries = config.max_sequences * r.num_layers_ * r.num_kv_heads_;
  try {
    const auto on = [&](at::ScalarType t) { return at::TensorOptions().dtype(t).device(device); };
    // Every page free, every table empty (kv::leankv::init_pages' state).
    r.pages_ = at::zeros({num_pages, format.page_bytes()}, on(at::kByte));
    r.ring_ = at::arange(num_pages, on(at::kInt));
    r.counters_ = at::tensor(std::vector<int64_t>{0, num_pages, 0}, at::kLong).to(device);
    r.tables_ = at::full({entries, r.width_}, -1, on(at::kInt));
    r.page_counts_ = at::zeros({entries, 2}, on(at::kInt));
    r.token_counts_ = at::zeros({entries, 2}, on(at::kInt));
    r.tokens_per_page_ = at::tensor(std::vector<int32_t>{format.tokens_per_page(Precision::kHigh),
                                                         format.tokens_per_page(Precision::kLow)},
                                    at::kInt)
                             .to(device);
    r.window_ = at::zeros(
        {r.num_layers_, config.max_sequences, 2, r.num_kv_heads_, r.capacity_, r.head_dim_},
        on(dtype));
    r.window_acc_ = at::zeros({r.num_layers_, config.max_sequences, r.num_kv_heads_, r.capacity_},
                              on(at::kFloat));
  } catch (const std::exception&) {
    return resource_exhausted_error("leankv: cannot allocate " + std::to_string(config.pool_bytes) +
                                    " bytes of pages");
  }
  for (int32_t s = config.max_sequences - 1; s >= 0; --s) r.free_slots_.push_back(s);
  return r;
}

void LeanKvRuntime::pages(kernels::LeanKvPageOp op, const std::vector<int32_t>& entries,
                          const at::Tensor& amounts) {
  kernels::leankv_pages(op, ring_, counters_, tables_, page_counts_,
                        at::tensor(entries, at::kInt).to(ring_.device()),
                        amounts.to(ring_.device()).contiguous(), backend_);
}

int64_t LeanKvRuntime::counter(int index) const { return counters_[index].item<int64_t>(); }

bool LeanKvRuntime::decoding(SeqId seq) const { return slots_.contains(seq); }

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
    const at::Tensor scores = (accs[l].cpu() / later).contiguous();
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
  pages(kernels::LeanKvPageOp::kAllocate, entries,
        at::tensor(conservative, at::kInt).view({count, 2}));
  if (const int64_t short_by = counter(kv::leankv::kShortfall); short_by > 0) {
    prompt_sums_.erase(sums);
    ++ended_.failed_prompts;
    return resource_exhausted_error("leankv: the page pool lacks " + std::to_string(short_by) +
                                    " pages for a prompt of " + std::to_string(n) + " tokens");
  }
  pages(kernels::LeanKvPageOp::kSplit, entries, at::tensor(keep, at::kInt).view({count, 2}));
  free_slots_.pop_back();
  slots_[seq] = slot;

  // The entries' token counts, then each layer's tokens where those counts put them.
  std::vector<int32_t> counts_of;
  for (size_t i = 0; i < high.size(); ++i) {
    counts_of.push_back(static_cast<int32_t>(high[i].size()));
    counts_of.push_back(static_cast<int32_t>(low[i].size()));
  }
  const at::Device device = pages_.device();
  token_counts_.narrow(0, entry(slot, 0, 0), std::ssize(high))
      .copy_(at::tensor(counts_of, at::kInt).view({-1, 2}));
  const at::Tensor window_cells = at::arange(stored, n, at::kLong).remainder(capacity_).to(device);
  for (int64_t l = 0; l < num_layers_; ++l) {
    const auto [keys, values] = kv_of(l);  // [n, Hkv, D]
    const at::Tensor layer_entries =
        at::arange(entry(slot, l, 0), entry(slot, l, 0) + num_kv_heads_, at::kInt).to(device);
    for (const Precision p : {Precision::kHigh, Precision::kLow}) {
      // Rows of [Hkv * n, D] (head-major), in the entries' token order.
      std::vector<int64_t> index;
      for (int64_t h = 0; h < num_kv_heads_; ++h) {
        const size_t i = l * num_kv_heads_ + h;
        for (const int64_t t : p == Precision::kHigh ? high[i] : low[i]) index.push_back(h * n + t);
      }
      if (index.empty()) continue;
      const at::Tensor rows = long_tensor(index).to(device);
      const auto [page, cell] =
          kernels::aten::leankv_token_slots(format_, p, tables_, token_counts_, layer_entries);
      kernels::leankv_write_tokens(
          pages_, format_, p, page, cell,
          keys.permute({1, 0, 2}).reshape({-1, head_dim_}).index_select(0, rows),
          values.permute({1, 0, 2}).reshape({-1, head_dim_}).index_select(0, rows),
          accs[l].reshape({-1}).index_select(0, rows).to(at::kFloat),
          rows.remainder(n).to(at::kInt), backend_);
    }
    at::Tensor window = window_[l][slot];  // [2, Hkv, capacity, D]
    window[0].index_copy_(1, window_cells,
                          keys.narrow(0, stored, kept_window).permute({1, 0, 2}).to(dtype_));
    window[1].index_copy_(1, window_cells,
                          values.narrow(0, stored, kept_window).permute({1, 0, 2}).to(dtype_));
    window_acc_[l][slot].index_copy_(1, window_cells, accs[l].narrow(1, stored, kept_window));
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
  const at::Device device = pages_.device();
  const at::Tensor slot_index = long_tensor(slot_list).to(device);
  const at::Tensor window = window_[layer].index_select(0, slot_index);
  at::Tensor window_acc = window_acc_[layer].index_select(0, slot_index);
  // Stored plus window tokens of a (sequence, KV head) never exceed its length.
  const int64_t max_tokens = *std::max_element(positions.begin(), positions.end()) + 1;
  const at::Tensor out = kernels::leankv_decode_attention(
      q.contiguous(), pages_, format_, tables_, token_counts_,
      at::tensor(entries, at::kInt).view({m, num_kv_heads_}).to(device), window,
      at::tensor(lens, at::kInt).to(device), window_acc, max_tokens, scale, backend_);
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
  const at::Device device = pages_.device();
  const at::Tensor entry_ids = at::tensor(entries, at::kInt).to(device);
  const at::Tensor acc =
      window_acc_[layer].view({-1}).index_select(0, long_tensor(acc_cells).to(device));
  const at::Tensor score = acc / at::full_like(acc, static_cast<float>(config_.window));
  const auto [actions, amounts] =
      kernels::leankv_settle_plan(pages_, format_, tables_, token_counts_, entry_ids,
                                  long_tensor(lengths).to(device), score, thresholds_, backend_);
  const at::Tensor action_host = actions.cpu();  // the pruned counts (on CUDA: a sync)
  const int32_t* action = action_host.data_ptr<int32_t>();
  for (int64_t i = 0; i < m; ++i) {
    const bool candidate_pruned = action[3 * i] == static_cast<int32_t>(Tier::kPruned);
    const bool victim_pruned =
        action[3 * i + 1] >= 0 && action[3 * i + 2] == static_cast<int32_t>(Tier::kPruned);
    pruned_[seqs[seq_of[i]]] += candidate_pruned + victim_pruned;
  }
  pages(kernels::LeanKvPageOp::kAllocate, entries, amounts);
  if (const int64_t short_by = counter(kv::leankv::kShortfall); short_by > 0) {
    return resource_exhausted_error("leankv: the page pool lacks " + std::to_string(short_by) +
                                    " pages for a decode step");
  }
  const at::Tensor rows = window_[layer].view({-1, head_dim_});
  kernels::leankv_settle_apply(pages_, format_, tables_, token_counts_, entry_ids, actions,
                               rows.index_select(0, long_tensor(key_rows).to(device)),
                               rows.index_select(0, long_tensor(value_rows).to(device)), acc,
                               at::tensor(candidates, at::kInt).to(device), backend_);
  return Status();
}

void LeanKvRuntime::end(SeqId seq) {
  prompt_sums_.erase(seq);
  auto it = slots_.find(seq);
  if (it == slots_.end()) {
    pruned_.erase(seq);
    return;
  }
  // The slot's entries are contiguous: every layer and KV head of it.
  const int64_t heads = num_layers_ * num_kv_heads_, first = entry(it->second, 0, 0);
  std::vector<int32_t> entries(heads);
  std::iota(entries.begin(), entries.end(), static_cast<int32_t>(first));
  const at::Tensor tokens = token_counts_.narrow(0, first, heads).sum(0).cpu();
  const int64_t high = tokens[0].item<int64_t>(), low = tokens[1].item<int64_t>();
  const int64_t window = std::min<int64_t>(lengths_[seq], config_.window) * heads;
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
  token_counts_.narrow(0, first, heads).zero_();
  // Every page of each entry back to the ring.
  pages(kernels::LeanKvPageOp::kRelease, entries, page_counts_.narrow(0, first, heads).clone());
  free_slots_.push_back(it->second);
  slots_.erase(it);
}

int64_t LeanKvRuntime::step_pages(SeqId seq) const {
  auto it = slots_.find(seq);
  if (it == slots_.end()) return 0;
  const int64_t heads = num_layers_ * num_kv_heads_, first = entry(it->second, 0, 0);
  // An entry whose high or low section has filled its last page.
  const at::Tensor full = token_counts_.narrow(0, first, heads) >=
                          page_counts_.narrow(0, first, heads) * tokens_per_page_;
  return full.any(1).sum().item<int64_t>();
}

LeanKvCounts LeanKvRuntime::counts() const {
  LeanKvCounts c = ended_;
  const int64_t heads = num_layers_ * num_kv_heads_;
  for (const auto& [seq, slot] : slots_) {
    const at::Tensor tokens = token_counts_.narrow(0, entry(slot, 0, 0), heads).sum(0).cpu();
    c.high += tokens[0].item<int64_t>();
    c.low += tokens[1].item<int64_t>();
  }
  for (const auto& [seq, pruned] : pruned_) c.pruned += pruned;
  c.num_pages = ring_.size(0);
  c.pages_used = c.num_pages - free_pages();
  return c;
}

}  // namespace strata::executor
