// LeanKV's token significance policy (LeanKV §3.2-3.3, docs/leankv.md): which tier each token of
// one (request, layer, KV head) lives in, high precision (K8V4), low precision (K4V2) or pruned,
// from the attention it receives. No token budget: global thresholds alpha / length decide, so
// each head keeps what its own attention needs.
//
// Positions are 0-based here (the paper's i is position + 1). A token's *significance* is the
// mean attention it received from the later tokens of its sequence,
//   score(p) = acc(p) / (n - 1 - p)      for a sequence of n tokens, p < n - 1,
// where acc(p) sums, over every later query, the max over the KV head's query-head group of that
// query's softmax probability on p (the prompt's column sums start it, each decode step adds its
// row; docs/leankv.md says why max per row rather than max of the sums).
//
// The `window` most recent tokens stay in full precision outside the tiers. When a new token
// enters, the oldest window token (the *candidate*) leaves it and Algorithm 1 runs once: the
// candidate enters the tier its score reaches, and at most one token of that tier (the *victim*,
// its least significant) moves down one tier or out. Consequences the tests hold the policy to:
// a head's stored tokens grow by at most one per step, neither tier ever shrinks during decode,
// window tokens are never touched, and tokens only move down.
#pragma once

#include <cstdint>
#include <span>

#include "strata/kv/leankv_decision.h"

namespace strata::kv::leankv {

// Prompt phase: the tier of every token of a prompt of n = scores.size() tokens from its scores
// (scores[p] = score(p) above; the last token's is not read). The last `window` tokens are
// kWindow; token p before them is kHigh if scores[p] >= alpha_high / (p + 1), kLow if
// scores[p] >= alpha_low / (p + 1), kPruned otherwise (the paper's 1/i "theoretical average").
void prompt_tiers(std::span<const float> scores, const Thresholds& thresholds,
                  std::span<Tier> tiers);

// decide() over the scores of the tokens now in each tier.
DecodeAction decode_step(float candidate, std::span<const float> high, std::span<const float> low,
                         int64_t length, const Thresholds& thresholds);

}  // namespace strata::kv::leankv
