#include "strata/sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>

#include "strata/common/check.h"

namespace strata::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kFloatMax = std::numeric_limits<float>::max();
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

// Below this many, top-n is one pass with a sorted insertion buffer; above, bucket selection.
constexpr int64_t kMaxInsertionTopN = 64;
// The first prefix of a boundary bucket that the nucleus sorts; each further round sorts
// kBoundaryGrowth times more.
constexpr size_t kBoundaryFirstChunk = 64;
constexpr size_t kBoundaryGrowth = 4;
// Independent accumulators in the linear passes (lets the compiler keep several in flight and
// vectorise, while the summation order stays fixed, hence deterministic).
constexpr size_t kLanes = 8;

// Buckets over how far a logit lies below the maximum, best first: bucket b holds the tokens whose
// probability relative to the most likely one is in (2^(-(b+1)/16), 2^(-b/16)], and the last
// bucket everything further down (2^-128, where exp underflows anyway). Float rounding is monotone,
// so a token in a lower bucket always has a strictly higher logit than one in a higher bucket.
constexpr size_t kNumBuckets = 2048;
constexpr float kBucketsPerNat = 16 / 0.693147180559945309f;
size_t bucket_of(float logit, float max) {
  constexpr auto kLast = static_cast<float>(kNumBuckets - 1);
  const float t = (max - logit) * kBucketsPerNat;  // >= 0; +inf when masked
  return static_cast<size_t>(t < kLast ? t : kLast);
}

// Per-thread scratch reused across calls and samplers; sized to the largest vocabulary seen.
struct Workspace {
  std::vector<float> scaled;           // [vocab] penalised logits, then divided by the temperature
  std::vector<float> exps;             // [vocab] exp(scaled - max scaled), in [0, 1]
  std::vector<TokenId> candidates;     // surviving ids once truncation ran (order: see draw())
  std::vector<TokenId> boundary;       // ids of the bucket where a top-k / top-p cut falls
  std::vector<TokenId> top;            // top-n ids for the logprobs
  std::vector<uint16_t> buckets;       // [vocab] bucket_of() of each logit
  std::vector<int64_t> bucket_counts;  // [kNumBuckets]
  std::vector<double> bucket_masses;   // [kNumBuckets]
};
thread_local Workspace t_workspace;

// SplitMix64's output function: a bijective 64-bit mixer.
uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// exp(x) for x <= 0 (-inf included) within 1e-7 relative error, written without branches or
// library calls so that the loop over the vocabulary vectorises (Cephes expf: x = n ln2 + r,
// |r| <= ln2 / 2, degree-7 polynomial for e^r, times 2^n). exp(0) is exactly 1. Below
// kMinArg (where expf leaves the normal range) it returns 0.
inline float exp_nonpositive(float x) {
  constexpr float kMinArg = -87.33654f;
  const uint32_t keep = -static_cast<uint32_t>(x >= kMinArg);  // all ones unless x < kMinArg
  const float clamped = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & keep) |
                                             (std::bit_cast<uint32_t>(kMinArg) & ~keep));
  const int n = static_cast<int>(clamped * 1.44269504088896341f - 0.5f);  // round(x / ln2)
  const auto nf = static_cast<float>(n);
  const float r = (clamped - nf * 0.693359375f) + nf * 2.12194440e-4f;  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float mantissa = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(n + 127) << 23);  // 2^n
  return std::bit_cast<float>(std::bit_cast<uint32_t>(mantissa * scale) & keep);
}

// Multiplies every logit by `factor` in place; returns the maximum, and whether any result is
// NaN or +inf.
float scale_and_max(std::span<float> logits, float factor, bool* invalid) {
  float lane_max[kLanes];
  std::fill(std::begin(lane_max), std::end(lane_max), -kInf);
  int lane_invalid[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const float x = logits[i + j] * factor;
      logits[i + j] = x;
      lane_max[j] = x > lane_max[j] ? x : lane_max[j];
      lane_invalid[j] |= !(x < kInf);
    }
  }
  for (; i < logits.size(); ++i) {
    const float x = logits[i] * factor;
    logits[i] = x;
    lane_max[0] = x > lane_max[0] ? x : lane_max[0];
    lane_invalid[0] |= !(x < kInf);
  }
  float max = -kInf;
  int any_invalid = 0;
  for (size_t j = 0; j < kLanes; ++j) {
    max = lane_max[j] > max ? lane_max[j] : max;
    any_invalid |= lane_invalid[j];
  }
  *invalid = any_invalid != 0;
  return max;
}

// exps[i] = exp(logits[i] - max); returns their sum, in a fixed order: float lanes within blocks
// of kSumBlock (short enough to keep float rounding negligible), blocks added in double.
double exp_and_sum(std::span<const float> logits, float max, std::span<float> exps) {
  constexpr size_t kSumBlock = 256;
  static_assert(kSumBlock % kLanes == 0);
  double sum = 0;
  size_t i = 0;
  for (; i + kSumBlock <= logits.size(); i += kSumBlock) {
    float lane_sum[kLanes] = {};
    for (size_t k = i; k < i + kSumBlock; k += kLanes) {
      for (size_t j = 0; j < kLanes; ++j) {
        const float e = exp_nonpositive(logits[k + j] - max);
        exps[k + j] = e;
        lane_sum[j] += e;
      }
    }
    for (const float s : lane_sum) sum += s;
  }
  for (; i < logits.size(); ++i) {
    exps[i] = exp_nonpositive(logits[i] - max);
    sum += exps[i];
  }
  return sum;
}

// Better first: higher logit, then lower id. A strict weak order over ids (no NaN logits).
struct ByLogitDesc {
  const float* logits;
  bool operator()(TokenId a, TokenId b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// The min(n, size) best ids by ByLogitDesc, sorted best first, into *out. One pass with a sorted
// buffer of n; for n <= kMaxInsertionTopN.
void select_top_n_by_insertion(std::span<const float> logits, int64_t n,
                               std::vector<TokenId>* out) {
  const ByLogitDesc better{logits.data()};
  const auto capacity = static_cast<size_t>(std::min<int64_t>(n, std::ssize(logits)));
  out->clear();
  // Ids arrive in ascending order, so a newcomer equal to the worst kept one loses the tie.
  float worst = -kInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (out->size() == capacity) {
      if (!(logits[i] > worst)) continue;
      out->pop_back();
    }
    const auto id = static_cast<TokenId>(i);
    out->insert(std::upper_bound(out->begin(), out->end(), id, better), id);
    worst = logits[out->back()];
  }
}

// ws->buckets[i] = bucket_of(scaled[i], max) for every id.
std::span<const uint16_t> compute_buckets(std::span<const float> scaled, float max, Workspace* ws) {
  static_assert(kNumBuckets <= 65536);
  ws->buckets.resize(scaled.size());
  for (size_t i = 0; i < scaled.size(); ++i) {
    ws->buckets[i] = static_cast<uint16_t>(bucket_of(scaled[i], max));
  }
  return ws->buckets;
}

// Collects ids whose bucket is better than `cut` into *above and those in it into *boundary
// (both ascending).
void split_at_bucket(std::span<const uint16_t> buckets, size_t cut, std::vector<TokenId>* above,
                     std::vector<TokenId>* boundary) {
  above->clear();
  boundary->clear();
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] < cut) {
      above->push_back(static_cast<TokenId>(i));
    } else if (buckets[i] == cut) {
      boundary->push_back(static_cast<TokenId>(i));
    }
  }
}

// The k best ids by ByLogitDesc, sorted best first, into *out, for kMaxInsertionTopN < k < vocab:
// count the ids per bucket, keep the buckets before the one where the k-th id falls, and run
// nth_element only inside that bucket.
void select_top_k_by_buckets(std::span<const float> scaled, float max, int64_t k, Workspace* ws,
                             std::vector<TokenId>* out) {
  const std::span<const uint16_t> buckets = compute_buckets(scaled, max, ws);
  std::vector<int64_t>& counts = ws->bucket_counts;
  counts.assign(kNumBuckets, 0);
  for (const uint16_t b : buckets) ++counts[b];
  size_t cut = 0;
  int64_t num_above = 0;
  while (num_above + counts[cut] < k) num_above += counts[cut++];  // stops: k <= vocab
  std::vector<TokenId>& boundary = ws->boundary;
  split_at_bucket(buckets, cut, out, &boundary);
  const ByLogitDesc better{scaled.data()};
  const auto num_from_boundary = static_cast<std::ptrdiff_t>(k - num_above);
  std::nth_element(boundary.begin(), boundary.begin() + num_from_boundary, boundary.end(), better);
  out->insert(out->end(), boundary.begin(), boundary.begin() + num_from_boundary);
  std::sort(out->begin(), out->end(), better);
}

// Shortens `sorted` (best first) to its shortest prefix whose exp mass reaches `target`; leaves it
// whole if rounding keeps the sum just short.
void truncate_to_mass(std::span<const float> exps, double target, std::vector<TokenId>* sorted) {
  double mass = 0;
  for (size_t j = 0; j < sorted->size(); ++j) {
    mass += exps[(*sorted)[j]];
    if (mass >= target) {
      sorted->resize(j + 1);
      return;
    }
  }
}

// Top-p over the whole vocabulary, into *out: the ids of the buckets before the one where the
// cumulative mass (best first) reaches top_p, plus the best prefix of that bucket that reaches
// it. Only that prefix is sorted, in rounds of growing size. Order of *out: the ids before the
// bucket ascending, then the prefix best first.
void select_nucleus(std::span<const float> scaled, std::span<const float> exps, float max,
                    double top_p, Workspace* ws, std::vector<TokenId>* out) {
  std::vector<double>& masses = ws->bucket_masses;
  const std::span<const uint16_t> buckets = compute_buckets(scaled, max, ws);
  masses.assign(kNumBuckets, 0.0);
  for (size_t i = 0; i < scaled.size(); ++i) masses[buckets[i]] += exps[i];
  double total = 0;
  for (const double m : masses) total += m;
  const double target = top_p * total;
  size_t cut = 0;
  double mass = 0;
  while (cut + 1 < kNumBuckets && mass + masses[cut] < target) mass += masses[cut++];
  std::vector<TokenId>& boundary = ws->boundary;
  split_at_bucket(buckets, cut, out, &boundary);

  const ByLogitDesc better{scaled.data()};
  size_t num_sorted = 0;
  size_t chunk = kBoundaryFirstChunk;
  while (num_sorted < boundary.size()) {
    const size_t end = std::min(boundary.size(), num_sorted + chunk);
    const auto first = boundary.begin() + static_cast<std::ptrdiff_t>(num_sorted);
    const auto last = boundary.begin() + static_cast<std::ptrdiff_t>(end);
    if (end < boundary.size()) std::nth_element(first, last, boundary.end(), better);
    std::sort(first, last, better);
    for (size_t j = num_sorted; j < end; ++j) {
      mass += exps[boundary[j]];
      if (mass >= target) {
        out->insert(out->end(), boundary.begin(),
                    boundary.begin() + static_cast<std::ptrdiff_t>(j + 1));
        return;
      }
    }
    num_sorted = end;
    chunk *= kBoundaryGrowth;
  }
  out->insert(out->end(), boundary.begin(), boundary.end());  // rounding kept mass just short
}

// Inverse-CDF draw: the first id (in `ids` order) whose cumulative exp exceeds u * total, where
// total is the exp mass of `ids` summed in the same order. Zero-mass ids are never picked.
template <typename Ids>
TokenId draw_by_mass(const Ids& ids, std::span<const float> exps, double total, double u) {
  const double target = u * total;
  double mass = 0;
  TokenId last_positive = -1;
  for (const auto id : ids) {
    const float e = exps[static_cast<size_t>(id)];
    if (e <= 0) continue;
    mass += e;
    last_positive = static_cast<TokenId>(id);
    if (mass > target) return last_positive;
  }
  // Only reachable through rounding (u * total within an ulp of total).
  STRATA_CHECK(last_positive >= 0) << "no candidate with positive probability";
  return last_positive;
}

// Counts 0, 1, ..., n-1 without materialising them.
struct IdRange {
  struct Iterator {
    int64_t i;
    int64_t operator*() const { return i; }
    Iterator& operator++() {
      ++i;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return i != o.i; }
  };
  int64_t n;
  Iterator begin() const { return {0}; }
  Iterator end() const { return {n}; }
};

uint64_t random_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
}

}  // namespace

SequenceSampler::SequenceSampler(SamplingParams params, int64_t vocab_size,
                                 std::span<const TokenId> prompt_tokens)
    : params_(std::move(params)), vocab_size_(vocab_size) {
  const Status valid = params_.validate(vocab_size_);
  STRATA_CHECK(valid.ok()) << valid.to_string();
  seed_ = params_.seed.has_value() ? *params_.seed : random_seed();
  stream_key_ = mix64(seed_ + kGoldenGamma);
  if (params_.grammar) matcher_ = std::make_shared<GrammarMatcher>(params_.grammar);
  const bool track_seen = params_.repetition_penalty != 1.0;
  for (const TokenId token : prompt_tokens) {
    STRATA_CHECK(token >= 0 && token < vocab_size_)
        << "prompt token " << token << " outside [0, " << vocab_size_ << ")";
    if (track_seen) seen_tokens_.insert(token);
  }
}

bool SequenceSampler::greedy() const { return params_.temperature < kGreedyTemperature; }

void SequenceSampler::accept(TokenId token) {
  STRATA_CHECK(token >= 0 && token < vocab_size_)
      << "token " << token << " outside [0, " << vocab_size_ << ")";
  ++num_generated_;
  if (matcher_ && !grammar_broken_ && !matcher_->accept(token)) grammar_broken_ = true;
  if (params_.repetition_penalty != 1.0) seen_tokens_.insert(token);
  if (params_.presence_penalty != 0.0 || params_.frequency_penalty != 0.0) {
    ++output_counts_[token];
  }
}

bool SequenceSampler::grammar_complete() const {
  return matcher_ && !grammar_broken_ && matcher_->complete();
}

void SequenceSampler::apply_grammar(std::span<float> logits) const {
  if (!matcher_ || grammar_broken_) return;
  const std::shared_ptr<const TokenMask> mask = matcher_->allowed_tokens();
  const auto allowed_ids = static_cast<int64_t>(mask->size()) * 64;
  bool any = false;
  for (int64_t id = 0; id < vocab_size_; ++id) {
    if (id < allowed_ids && mask_allows(*mask, static_cast<TokenId>(id))) {
      any = any || !std::isinf(logits[static_cast<size_t>(id)]);
    } else {
      logits[static_cast<size_t>(id)] = -kInf;
    }
  }
  STRATA_CHECK(any) << "the grammar allows no token the model can produce";
}

double SequenceSampler::next_uniform() const {
  const uint64_t bits =
      mix64(stream_key_ + static_cast<uint64_t>(num_generated_ + 1) * kGoldenGamma);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

void SequenceSampler::apply_penalties(std::span<float> logits) const {
  // Clamped so that an extreme (but valid) penalty cannot turn a finite logit into an infinity.
  const auto store = [](float& logit, double value) {
    logit = static_cast<float>(std::clamp(value, -kFloatMax, kFloatMax));
  };
  const double repetition = params_.repetition_penalty;
  for (const TokenId token : seen_tokens_) {
    float& logit = logits[static_cast<size_t>(token)];
    if (std::isinf(logit)) continue;
    store(logit, logit > 0 ? logit / repetition : logit * repetition);
  }
  for (const auto& [token, count] : output_counts_) {
    float& logit = logits[static_cast<size_t>(token)];
    if (std::isinf(logit)) continue;
    store(logit, logit - params_.frequency_penalty * count - params_.presence_penalty);
  }
}

TokenId SequenceSampler::draw(std::span<const float> scaled, std::span<const float> exps,
                              float max_logit, double exp_sum) const {
  Workspace& ws = t_workspace;
  std::vector<TokenId>& candidates = ws.candidates;
  // Whether `candidates` holds the survivors; otherwise the whole vocabulary does. Their order
  // is deterministic (best first after top-k; see select_nucleus() after top-p alone) and is the
  // order of the inverse-CDF draw.
  bool truncated = false;
  if (params_.top_k > 0 && params_.top_k < vocab_size_) {
    if (params_.top_k <= kMaxInsertionTopN) {
      select_top_n_by_insertion(scaled, params_.top_k, &candidates);
    } else {
      select_top_k_by_buckets(scaled, max_logit, params_.top_k, &ws, &candidates);
    }
    truncated = true;
  }
  if (params_.top_p < 1.0) {
    if (truncated) {
      double mass = 0;
      for (const TokenId id : candidates) mass += exps[static_cast<size_t>(id)];
      truncate_to_mass(exps, params_.top_p * mass, &candidates);
    } else {
      select_nucleus(scaled, exps, max_logit, params_.top_p, &ws, &candidates);
      truncated = true;
    }
  }
  if (params_.min_p > 0.0) {
    // The most likely token has exp == 1 exactly, so the threshold is min_p itself; that token
    // always survives, and renormalisation by earlier steps does not change ratios.
    const auto below = [&](TokenId id) { return exps[static_cast<size_t>(id)] < params_.min_p; };
    if (truncated) {
      candidates.erase(std::remove_if(candidates.begin(), candidates.end(), below),
                       candidates.end());
    } else {
      candidates.clear();
      for (size_t i = 0; i < exps.size(); ++i) {
        if (exps[i] >= params_.min_p) candidates.push_back(static_cast<TokenId>(i));
      }
      truncated = true;
    }
  }
  const double u = next_uniform();
  if (!truncated) return draw_by_mass(IdRange{vocab_size_}, exps, exp_sum, u);
  double mass = 0;
  for (const TokenId id : candidates) mass += exps[static_cast<size_t>(id)];
  return draw_by_mass(candidates, exps, mass, u);
}

SampleResult SequenceSampler::sample(std::span<const float> logits) const {
  STRATA_CHECK_EQ(static_cast<int64_t>(logits.size()), vocab_size_);
  const auto vocab = static_cast<size_t>(vocab_size_);
  Workspace& ws = t_workspace;
  ws.scaled.assign(logits.begin(), logits.end());
  const std::span<float> scaled(ws.scaled.data(), vocab);
  apply_penalties(scaled);
  apply_grammar(scaled);

  const bool is_greedy = greedy();
  // At least FLT_MIN so that a huge temperature cannot make -inf * 0 = NaN.
  const float inv_temperature = is_greedy ? 1.0f
                                          : std::max(static_cast<float>(1.0 / params_.temperature),
                                                     std::numeric_limits<float>::min());
  bool invalid = false;
  const float max_logit = scale_and_max(scaled, inv_temperature, &invalid);
  STRATA_CHECK(!invalid) << "logits contain NaN or +inf";
  STRATA_CHECK(max_logit > -kInf) << "every logit is -inf";

  ws.exps.resize(vocab);
  const std::span<float> exps(ws.exps.data(), vocab);
  const double exp_sum = exp_and_sum(scaled, max_logit, exps);
  const double log_normalizer = static_cast<double>(max_logit) + std::log(exp_sum);
  const auto logprob = [&](TokenId id) {
    return static_cast<float>(static_cast<double>(scaled[static_cast<size_t>(id)]) -
                              log_normalizer);
  };

  SampleResult result;
  if (is_greedy) {
    // The first maximum: lowest id on ties.
    result.token =
        static_cast<TokenId>(std::find(scaled.begin(), scaled.end(), max_logit) - scaled.begin());
  } else {
    result.token = draw(scaled, exps, max_logit, exp_sum);
  }
  result.logprob = logprob(result.token);
  if (params_.num_logprobs > 0) {
    select_top_n_by_insertion(scaled, params_.num_logprobs, &ws.top);
    result.top_logprobs.reserve(ws.top.size());
    for (const TokenId id : ws.top) result.top_logprobs.push_back({id, logprob(id)});
  }
  return result;
}

}  // namespace strata::sampling
