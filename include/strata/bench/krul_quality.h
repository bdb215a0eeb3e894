// Krul's accuracy experiment on the executor (docs/krul.md, Krul §8 and its Table 4 protocol):
// how much a resumed turn loses when its history's KV comes back from cross-layer merged pairs.
//
// The history (earlier turns of a real conversation) is computed once with its attention observed
// (the executor's split statistics) and saved as store chunks (keys before RoPE). The I-R layers
// (edge share >= gamma) and Krul's pairs (select_pairs at `share`) come from those statistics;
// MiniCache's fixed pairs are adjacent layers of the second half. Each pair's keys and values are
// merged (MiniCache: SLERP at t, magnitudes, retention) and restored into both layers' chunks,
// which are then loaded (re-rotated like any stored chunk) in front of the continuation (the next
// turn), scored by teacher forcing:
//   full       the saved chunks as they are (the reference)
//   krul       Krul's per-conversation pairs
//   minicache  adjacent pairs (L/2, L/2+1), ... over the second half: as many layers as krul
// The cost of the statistics is measured beside: the history's pass with and without observing,
// the reduction of its prompt rows, and decode steps with and without observing. With a row
// stride > 1 the sampled estimator (kv_store.krul_row_stride) runs too: its cost, and how far
// its I-R layers and pairs agree with those of every row.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/kv/krul_policy.h"

namespace strata::executor {
class Executor;
}

namespace strata::bench {

struct KrulQualityOptions {
  double gamma = 0.5;    // I-R threshold on the edge share
  double share = 0.5;    // share of all layers paired (Algorithm 1's r_l over N)
  double slerp_t = 0.6;  // MiniCache's interpolation toward the deeper layer
  double retain = 0.05;  // top share of the angle range kept unmerged
  int64_t eval_chunk_tokens = 512;
  int32_t decode_steps = 16;  // steps timed with and without observing (0: none)
  int32_t row_stride = 1;     // > 1: also the estimator observing rows at its multiples
};

struct KrulVariant {
  std::string name;
  std::vector<kv::krul::LayerPair> pairs;
  double nll = 0;  // summed over the scored tokens
  double perplexity = 0;
  double retained_share = 0;  // of the merged (token, KV head) vectors kept unmerged
};

struct KrulQualityResult {
  int64_t history_tokens = 0;
  int64_t scored_tokens = 0;
  std::vector<double> edge_share;  // per layer
  std::vector<bool> initial_recent;
  std::vector<KrulVariant> variants;    // full, krul, minicache
  double prefill_seconds = 0;           // the history's pass, not observed
  double prefill_observed_seconds = 0;  // the same pass observing (copies only)
  double reduce_seconds = 0;            // reducing its prompt rows (take)
  double decode_step_seconds = 0;       // mean decode step, not observed
  double decode_step_observed_seconds = 0;
  // The sampled estimator (row_stride > 1): the same three costs, and the share of layers whose
  // I-R verdict and of Krul's pairs it finds alike with every row's.
  double sampled_prefill_observed_seconds = 0;
  double sampled_reduce_seconds = 0;
  double sampled_decode_step_seconds = 0;
  double sampled_initial_recent_agreement = 0;
  double sampled_pairs_agreement = 0;
};

// Runs the experiment on one conversation: history (a multiple of the block size, >= 2 blocks)
// then continuation (>= 2 tokens; its first is not scored). The executor's pool must hold three
// sequences of history + continuation tokens. INVALID_ARGUMENT for lengths that do not fit.
StatusOr<KrulQualityResult> measure_krul_quality(executor::Executor& executor,
                                                 std::span<const TokenId> history,
                                                 std::span<const TokenId> continuation,
                                                 const KrulQualityOptions& options);

}  // namespace strata::bench
