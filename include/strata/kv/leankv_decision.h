// LeanKV's decode-step decision (Algorithm 1; LeanKV §3.3, docs/leankv.md): the tiers and
// thresholds of kv/leankv_policy.h and the decision itself, shared by the host policy and the CUDA
// kernels of the decode step (kernels/leankv/settle.cu), so both decide by the same code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_LEANKV_HOST_DEVICE __host__ __device__
#else
#define STRATA_LEANKV_HOST_DEVICE
#endif

namespace strata::kv::leankv {

enum class Tier : int8_t { kHigh = 0, kLow = 1, kPruned = 2, kWindow = 3 };

struct Thresholds {
  double alpha_high = 1.0;  // high precision when score >= alpha_high / length
  double alpha_low = 0.02;  // low precision when score >= alpha_low / length; pruned below
  int32_t window = 64;      // most recent tokens kept in full precision (>= 1)
};

// What one decode step does to one head's tiers (Algorithm 1).
struct DecodeAction {
  Tier candidate = Tier::kPruned;  // where the candidate goes (kHigh, kLow or kPruned)
  int32_t victim = -1;             // index in the candidate's tier (its scores span), or -1
  Tier victim_to = Tier::kPruned;  // kLow (demoted from high) or kPruned
};

// A tier's least significant token: its score and index (the lowest index on ties; -1 when the
// tier is empty).
struct TierMinimum {
  float score = 0.0f;
  int32_t index = -1;
};

// Algorithm 1 for a sequence of `length` tokens (the new one included), with thresholds
// T_h = alpha_high / length and T_l = alpha_low / length, from the candidate's score and each
// tier's least significant token. The victim is the least significant token of the candidate's
// tier; from high it is demoted when its score is in [T_l, T_h) and pruned below T_l, from low it
// is pruned below T_l, and otherwise stays. In single precision, so that the host and the kernels
// (which use no double-precision instructions) decide alike.
STRATA_LEANKV_HOST_DEVICE inline DecodeAction decide(float candidate, TierMinimum high,
                                                     TierMinimum low, int64_t length,
                                                     float alpha_high, float alpha_low) {
  const float t_high = alpha_high / static_cast<float>(length);
  const float t_low = alpha_low / static_cast<float>(length);
  DecodeAction action;
  if (candidate >= t_high) {
    action.candidate = Tier::kHigh;
    if (high.index >= 0 && high.score < t_high) {
      action.victim = high.index;
      action.victim_to = high.score >= t_low ? Tier::kLow : Tier::kPruned;
    }
  } else if (candidate >= t_low) {
    action.candidate = Tier::kLow;
    if (low.index >= 0 && low.score < t_low) {
      action.victim = low.index;
      action.victim_to = Tier::kPruned;
    }
  }
  return action;
}

}  // namespace strata::kv::leankv
