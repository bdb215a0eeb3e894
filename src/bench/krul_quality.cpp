#include "strata/bench/krul_quality.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <ranges>
#include <string>
#include <vector>

#include "kv_experiment.h"
#include "strata/common/clock.h"
#include "strata/executor/executor.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"

namespace strata::bench {
namespace {

using kv::krul::LayerPair;
using Clock = SteadyClock;

// The saved chunks as one tensor [chunks, layers, 2 (K, V), Hkv, B, D] (Executor::kv_chunk_bytes'
// layout) and back.
at::Tensor stack_chunks(const Chunks& chunks, const executor::Executor& executor) {
  const model::ModelConfig& c = executor.config();
  const int64_t b = executor.kv_geometry().block_size_tokens;
  at::Tensor t = at::empty(
      {static_cast<int64_t>(chunks.size()), c.num_layers, 2, c.num_kv_heads, b, c.head_dim},
      kernels::aten::scalar_type(executor.dtype()));
  const size_t bytes = static_cast<size_t>(executor.kv_chunk_bytes());
  for (size_t i = 0; i < chunks.size(); ++i) {
    std::memcpy(static_cast<std::byte*>(t.data_ptr()) + i * bytes, chunks[i].data(), bytes);
  }
  return t;
}

Chunks unstack_chunks(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const size_t bytes = static_cast<size_t>(c[0].numel() * c.element_size());
  Chunks chunks(static_cast<size_t>(c.size(0)), std::vector<std::byte>(bytes));
  for (size_t i = 0; i < chunks.size(); ++i) {
    std::memcpy(chunks[i].data(), static_cast<const std::byte*>(c.data_ptr()) + i * bytes, bytes);
  }
  return chunks;
}

// Chunks whose pairs are merged and restored into both layers; the share of merged vectors kept.
Chunks merge_pairs(const Chunks& saved, const std::vector<LayerPair>& pairs,
                   const executor::Executor& executor, const KrulQualityOptions& o,
                   double* retained) {
  at::Tensor t = stack_chunks(saved, executor);  // [C, L, 2, Hkv, B, D]
  int64_t kept = 0, total = 0;
  for (const LayerPair& p : pairs) {
    for (int64_t part = 0; part < 2; ++part) {
      // [C, Hkv, B, D] -> [C * B, Hkv, D]: a layer's keys or values of the whole history
      auto tokens = [&](int32_t layer) {
        return t.select(1, layer)
            .select(1, part)
            .permute({0, 2, 1, 3})
            .reshape({-1, t.size(3), t.size(5)});
      };
      auto [direction, magnitude, kept_index, originals] =
          kernels::aten::krul_merge(tokens(p.shallow), tokens(p.deep), o.slerp_t, o.retain);
      const at::Tensor back =
          kernels::aten::krul_unmerge(direction, magnitude, kept_index, originals);
      kept += kept_index.numel();
      total += direction.size(0) * direction.size(1);
      const int32_t layers[2] = {p.shallow, p.deep};
      for (int64_t which = 0; which < 2; ++which) {
        t.select(1, layers[which])
            .select(1, part)
            .copy_(back[which]
                       .reshape({t.size(0), t.size(4), t.size(3), t.size(5)})
                       .permute({0, 2, 1, 3}));
      }
    }
  }
  *retained = total > 0 ? static_cast<double>(kept) / static_cast<double>(total) : 0.0;
  return unstack_chunks(t);
}

}  // namespace

StatusOr<KrulQualityResult> measure_krul_quality(executor::Executor& executor,
                                                 std::span<const TokenId> history,
                                                 std::span<const TokenId> continuation,
                                                 const KrulQualityOptions& o) {
  Experiment x(executor);
  const int64_t b = x.block(), n = static_cast<int64_t>(history.size());
  const int64_t eval = static_cast<int64_t>(continuation.size());
  if (n % b != 0 || n < 2 * b || eval < 2 || o.eval_chunk_tokens < 1) {
    return invalid_argument_error("krul quality: a history of " + std::to_string(n) +
                                  " tokens (a multiple of " + std::to_string(b) +
                                  ", >= 2 blocks) and a continuation of " + std::to_string(eval) +
                                  " (>= 2) are needed");
  }
  const int32_t layers = static_cast<int32_t>(executor.config().num_layers);
  const std::vector<TokenId> history_ids(history.begin(), history.end());
  KrulQualityResult result;
  result.history_tokens = n;
  result.scored_tokens = eval - 1;

  // The history, not observed (the baseline's time), then observed and saved.
  {
    STRATA_RETURN_IF_ERROR(x.kv().add_sequence(SeqId{1}, history_ids, ""));
    const Clock::time_point start = Clock::now();
    STRATA_RETURN_IF_ERROR(x.run(SeqId{1}, n, executor::LogitsMode::kNone).status());
    result.prefill_seconds = seconds_since(start);
    x.kv().free(SeqId{1});
  }
  STRATA_RETURN_IF_ERROR(x.kv().add_sequence(SeqId{2}, history_ids, ""));
  Chunks saved = x.chunks(n / b);
  Clock::time_point start = Clock::now();
  STRATA_RETURN_IF_ERROR(
      x.run(SeqId{2}, n, executor::LogitsMode::kNone, {}, &saved, true).status());
  result.prefill_observed_seconds = seconds_since(start);
  start = Clock::now();
  std::optional<kv::krul::AttentionStats> stats = executor.take_attention_stats(SeqId{2});
  result.reduce_seconds = seconds_since(start);
  if (!stats) return internal_error("krul quality: the history's attention was not observed");
  // The sampled estimator over the same history.
  std::optional<kv::krul::AttentionStats> sampled;
  const bool samples = o.row_stride > 1;
  if (samples) {
    constexpr SeqId kSampled{100};
    STRATA_RETURN_IF_ERROR(x.kv().add_sequence(kSampled, history_ids, ""));
    start = Clock::now();
    STRATA_RETURN_IF_ERROR(
        x.run(kSampled, n, executor::LogitsMode::kNone, {}, nullptr, true, o.row_stride).status());
    result.sampled_prefill_observed_seconds = seconds_since(start);
    start = Clock::now();
    sampled = executor.take_attention_stats(kSampled);
    result.sampled_reduce_seconds = seconds_since(start);
    x.kv().free(kSampled);
    if (!sampled) return internal_error("krul quality: no sampled row was observed");
  }

  // Decode steps without observing, observing every row, and (sampled) every row_stride-th, on
  // the same sequence.
  const int32_t blocks = samples ? 3 : 2;
  for (int32_t i = 0; i < blocks * o.decode_steps; ++i) {
    const int32_t block = i / std::max(o.decode_steps, 1);
    const TokenId token = continuation[static_cast<size_t>(i % eval)];
    x.kv().append_tokens(SeqId{2}, std::span(&token, 1));
    start = Clock::now();
    STRATA_RETURN_IF_ERROR(x.run(SeqId{2}, 1, executor::LogitsMode::kLast, {}, nullptr, block > 0,
                                 block == 2 ? o.row_stride : 1)
                               .status());
    (block == 0   ? result.decode_step_seconds
     : block == 1 ? result.decode_step_observed_seconds
                  : result.sampled_decode_step_seconds) += seconds_since(start);
  }
  if (o.decode_steps > 0) {
    result.decode_step_seconds /= o.decode_steps;
    result.decode_step_observed_seconds /= o.decode_steps;
    result.sampled_decode_step_seconds /= o.decode_steps;
    (void)executor.take_attention_stats(SeqId{2});
  }
  x.kv().free(SeqId{2});

  for (int32_t l = 0; l < layers; ++l) result.edge_share.push_back(stats->edge_share(l));
  result.initial_recent = kv::krul::initial_recent_layers(*stats, o.gamma);
  const std::vector<LayerPair> krul =
      kv::krul::select_pairs(*stats, result.initial_recent, o.share);
  if (sampled) {
    const std::vector<bool> ir = kv::krul::initial_recent_layers(*sampled, o.gamma);
    result.sampled_initial_recent_agreement =
        static_cast<double>(
            std::ranges::count_if(std::views::iota(0, layers),
                                  [&](int32_t l) { return ir[l] == result.initial_recent[l]; })) /
        layers;
    const std::vector<LayerPair> pairs = kv::krul::select_pairs(*sampled, ir, o.share);
    const auto alike = std::ranges::count_if(pairs, [&](const LayerPair& p) {
      return std::ranges::any_of(
          krul, [&](const LayerPair& k) { return k.shallow == p.shallow && k.deep == p.deep; });
    });
    result.sampled_pairs_agreement =
        krul.empty() ? 1.0 : static_cast<double>(alike) / static_cast<double>(krul.size());
  }
  std::vector<LayerPair> minicache = kv::krul::adjacent_pairs(layers / 2, layers - 1);
  minicache.resize(std::min(minicache.size(), krul.size()));

  // Scores the continuation after the history loaded from `chunks`.
  std::vector<TokenId> all = history_ids;
  all.insert(all.end(), continuation.begin(), continuation.end());
  SeqId next{3};
  auto score = [&](const Chunks& chunks, KrulVariant& v) -> Status {
    const SeqId seq = next;
    next = SeqId{next.value + 1};
    STRATA_RETURN_IF_ERROR(x.kv().add_sequence(seq, all, ""));
    x.kv().set_external_prefix(seq, n / b, /*exact=*/false);
    std::vector<executor::KvLoad> loads(1);
    loads[0] = {seq, 0, {}, std::nullopt};
    for (const auto& c : chunks) loads[0].chunks.push_back(c.data());
    STRATA_ASSIGN_OR_RETURN(
        v.nll, x.score_continuation(seq, continuation, o.eval_chunk_tokens, std::move(loads)));
    x.kv().free(seq);
    v.perplexity = std::exp(v.nll / static_cast<double>(eval - 1));
    return Status();
  };
  for (const auto& [name, pairs] : {std::pair{"full", std::vector<LayerPair>{}},
                                    std::pair{"krul", krul}, std::pair{"minicache", minicache}}) {
    KrulVariant v{name, pairs};
    const Chunks chunks =
        pairs.empty() ? saved : merge_pairs(saved, pairs, executor, o, &v.retained_share);
    STRATA_RETURN_IF_ERROR(score(chunks, v));
    result.variants.push_back(std::move(v));
  }
  return result;
}

}  // namespace strata::bench
