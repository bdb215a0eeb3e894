#include "strata/kv/krul_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "strata/common/check.h"

namespace strata::kv::krul {

AttentionStats::AttentionStats(int32_t layers, int32_t heads, int32_t kv_heads)
    : num_layers(layers),
      num_heads(heads),
      num_kv_heads(kv_heads),
      edge_mass(static_cast<size_t>(layers), 0.0),
      observed(static_cast<size_t>(layers), 0),
      squared(static_cast<size_t>(layers) * layers * heads, 0.0) {
  STRATA_CHECK(layers > 0 && heads > 0 && kv_heads >= 0 && (kv_heads == 0 || heads % kv_heads == 0))
      << layers << " layers, " << heads << " heads, " << kv_heads << " KV heads";
}

void AttentionStats::add_token_mass(std::span<const float> mass) {
  STRATA_CHECK(num_kv_heads > 0 &&
               mass.size() % (static_cast<size_t>(num_layers) * num_kv_heads) == 0)
      << "token mass of " << mass.size() << " values for " << num_layers << "x" << num_kv_heads;
  if (mass.size() > token_mass.size()) token_mass.resize(mass.size(), 0.0F);
  for (size_t i = 0; i < mass.size(); ++i) token_mass[i] += mass[i];
}

double AttentionStats::edge_share(int32_t layer) const {
  const int64_t n = observed[static_cast<size_t>(layer)];
  return n > 0 ? edge_mass[static_cast<size_t>(layer)] / static_cast<double>(n) : 0.0;
}

double AttentionStats::distance(int32_t a, int32_t b) const {
  const int32_t deep = std::max(a, b), shallow = std::min(a, b);
  if (deep == shallow) return 0.0;
  double sum = 0;
  for (int32_t h = 0; h < num_heads; ++h)
    sum += std::sqrt(std::max(0.0, squared_at(deep, shallow, h)));
  return sum / num_heads;
}

void AttentionStats::add(const AttentionStats& other) {
  STRATA_CHECK(other.num_layers == num_layers && other.num_heads == num_heads &&
               other.num_kv_heads == num_kv_heads)
      << "statistics of " << other.num_layers << "x" << other.num_heads << "x" << other.num_kv_heads
      << " added to " << num_layers << "x" << num_heads << "x" << num_kv_heads;
  if (num_kv_heads > 0) add_token_mass(other.token_mass);
  for (size_t l = 0; l < edge_mass.size(); ++l) {
    edge_mass[l] += other.edge_mass[l];
    observed[l] += other.observed[l];
  }
  for (size_t i = 0; i < squared.size(); ++i) squared[i] += other.squared[i];
}

std::vector<bool> initial_recent_layers(const AttentionStats& stats, double gamma) {
  std::vector<bool> ir(static_cast<size_t>(stats.num_layers));
  for (int32_t l = 0; l < stats.num_layers; ++l) {
    ir[static_cast<size_t>(l)] =
        stats.observed[static_cast<size_t>(l)] > 0 && stats.edge_share(l) >= gamma;
  }
  return ir;
}

std::vector<LayerPair> select_pairs(const AttentionStats& stats, const std::vector<bool>& ir,
                                    double share) {
  STRATA_CHECK(std::ssize(ir) == stats.num_layers);
  std::vector<LayerPair> candidates;
  for (int32_t deep = 0; deep < stats.num_layers; ++deep) {
    for (int32_t shallow = 0; shallow < deep; ++shallow) {
      if (ir[static_cast<size_t>(deep)] && ir[static_cast<size_t>(shallow)]) {
        candidates.push_back({shallow, deep, stats.distance(deep, shallow)});
      }
    }
  }
  std::stable_sort(
      candidates.begin(), candidates.end(), [](const LayerPair& a, const LayerPair& b) {
        return std::tie(a.distance, a.shallow, a.deep) < std::tie(b.distance, b.shallow, b.deep);
      });
  // Until the used layers reach share * num_layers: pair_count pairs.
  const int32_t target = pair_count(share, stats.num_layers);
  std::vector<bool> used(static_cast<size_t>(stats.num_layers), false);
  std::vector<LayerPair> pairs;
  for (const LayerPair& p : candidates) {
    if (std::ssize(pairs) >= target) break;
    if (used[static_cast<size_t>(p.shallow)] || used[static_cast<size_t>(p.deep)]) continue;
    used[static_cast<size_t>(p.shallow)] = used[static_cast<size_t>(p.deep)] = true;
    pairs.push_back(p);
  }
  return pairs;
}

std::vector<LayerPair> adjacent_pairs(int32_t first, int32_t last) {
  std::vector<LayerPair> pairs;
  for (int32_t l = first; l + 1 <= last; l += 2) pairs.push_back({l, l + 1, 0.0});
  return pairs;
}

MergedForm merged_form(double share, double retain, int32_t num_layers, int64_t vectors_per_chunk) {
  return {.pairs = pair_count(share, num_layers),
          .retained = static_cast<int32_t>(
              std::ceil(retain * static_cast<double>(vectors_per_chunk) - 1e-9)),
          .slerp_t = 0.6,
          .retain = retain};
}

int64_t merged_layer_offset(std::span<const LayerPair> pairs, int32_t layer, int64_t layer_bytes,
                            int64_t pair_bytes) {
  int64_t offset = static_cast<int64_t>(layer) * layer_bytes;
  for (const LayerPair& p : pairs) {
    if (p.shallow < layer) offset -= layer_bytes;
    if (p.deep < layer) offset += pair_bytes;
  }
  return offset;
}

int32_t pair_count(double share, int32_t num_layers) {
  const auto layers = static_cast<int32_t>(std::ceil(share * num_layers - 1e-9));
  return std::min((std::max(layers, 0) + 1) / 2, num_layers / 2);
}

namespace {

enum class Role : uint8_t { kPlain, kShallow, kDeep };

std::vector<Role> roles(int32_t num_layers, const std::vector<LayerPair>& pairs) {
  std::vector<Role> r(static_cast<size_t>(num_layers), Role::kPlain);
  for (const LayerPair& p : pairs) {
    r[static_cast<size_t>(p.shallow)] = Role::kShallow;
    r[static_cast<size_t>(p.deep)] = Role::kDeep;
  }
  return r;
}

double compute_time(int64_t n, const RestoreCosts& c) {
  const double t = static_cast<double>(n);
  return t * c.compute_per_token + t * t * c.attention_per_token2;
}

// What loading the rest of one layer costs when it recomputes n of `tokens`.
double load_time(Role role, int64_t n, int64_t tokens, const RestoreCosts& c) {
  const double rest = static_cast<double>(tokens - n);
  switch (role) {
    case Role::kPlain:
      return rest * c.load_per_token;
    case Role::kDeep:
      return rest * c.merged_load_per_token;
    case Role::kShallow:
      return 0.0;  // the pair's suffix is counted once, at its deep layer
  }
  return 0.0;
}

}  // namespace

Status validate_pairs(const std::vector<LayerPair>& pairs, int32_t num_layers) {
  std::vector<bool> used(static_cast<size_t>(std::max(num_layers, 0)), false);
  for (const LayerPair& p : pairs) {
    if (p.shallow < 0 || p.shallow >= p.deep || p.deep >= num_layers ||
        used[static_cast<size_t>(p.shallow)] || used[static_cast<size_t>(p.deep)]) {
      return invalid_argument_error("krul: layer pair (" + std::to_string(p.shallow) + ", " +
                                    std::to_string(p.deep) + ") is not a disjoint pair of " +
                                    std::to_string(num_layers) + " layers");
    }
    used[static_cast<size_t>(p.shallow)] = used[static_cast<size_t>(p.deep)] = true;
  }
  return Status();
}

Status validate_plan(const std::vector<int64_t>& boundary, int64_t tokens,
                     const std::vector<LayerPair>& pairs) {
  const int32_t layers = static_cast<int32_t>(boundary.size());
  STRATA_RETURN_IF_ERROR(validate_pairs(pairs, layers));
  for (int32_t l = 0; l < layers; ++l) {
    const int64_t n = boundary[static_cast<size_t>(l)];
    if (n < 0 || n > tokens) {
      return invalid_argument_error("krul: layer " + std::to_string(l) + " recomputes " +
                                    std::to_string(n) + " of " + std::to_string(tokens) +
                                    " tokens");
    }
    if (l > 0 && n > boundary[static_cast<size_t>(l - 1)]) {
      return invalid_argument_error("krul: layer " + std::to_string(l) + " recomputes " +
                                    std::to_string(n) + " tokens but layer " +
                                    std::to_string(l - 1) + " only " +
                                    std::to_string(boundary[static_cast<size_t>(l - 1)]) +
                                    ": its hidden states for the rest would be missing");
    }
  }
  return Status();
}

void time_plan(RestorePlan& plan, int64_t tokens, const std::vector<LayerPair>& pairs,
               const RestoreCosts& costs) {
  const std::vector<Role> role = roles(static_cast<int32_t>(plan.boundary.size()), pairs);
  plan.compute_seconds = costs.other_compute;
  plan.load_seconds = 0;
  for (size_t l = 0; l < plan.boundary.size(); ++l) {
    plan.compute_seconds += compute_time(plan.boundary[l], costs);
    plan.load_seconds += load_time(role[l], plan.boundary[l], tokens, costs);
  }
}

RestorePlan plan_restore(int64_t tokens, int32_t num_layers, const std::vector<LayerPair>& pairs,
                         const RestoreCosts& costs, int64_t granularity,
                         std::span<const int64_t> floor) {
  STRATA_CHECK(tokens >= 0 && num_layers > 0 && granularity > 0);
  STRATA_CHECK(floor.empty() || std::ssize(floor) == num_layers);
  const std::vector<Role> role = roles(num_layers, pairs);
  std::vector<int64_t> level;  // the boundaries a layer may take
  for (int64_t n = 0; n < tokens; n += granularity) level.push_back(n);
  level.push_back(tokens);
  const size_t levels = level.size();

  // min over non-increasing boundaries of sum_l compute(n_l) + lambda * load(n_l): best[k] is the
  // cheapest prefix of layers whose last boundary is level[k]; a layer may take level k when the
  // previous one took some level >= k (a suffix minimum).
  auto solve = [&](double lambda) {
    std::vector<std::vector<uint32_t>> from(static_cast<size_t>(num_layers),
                                            std::vector<uint32_t>(levels));
    std::vector<double> best(levels, 0.0), next(levels);
    for (int32_t l = 0; l < num_layers; ++l) {
      // suffix minimum of the previous layer's costs (layer 0 has no constraint)
      double run = std::numeric_limits<double>::infinity();
      uint32_t arg = static_cast<uint32_t>(levels - 1);
      for (size_t k = levels; k-- > 0;) {
        if (l == 0 || best[k] < run) {
          run = l == 0 ? 0.0 : best[k];
          arg = static_cast<uint32_t>(k);
        }
        const bool allowed = floor.empty() || level[k] >= std::min(floor[l], tokens);
        const double own =
            allowed ? compute_time(level[k], costs) +
                          lambda * load_time(role[static_cast<size_t>(l)], level[k], tokens, costs)
                    : std::numeric_limits<double>::infinity();
        next[k] = run + own;
        from[static_cast<size_t>(l)][k] = arg;
      }
      best.swap(next);
    }
    RestorePlan plan;
    plan.boundary.resize(static_cast<size_t>(num_layers));
    size_t k = static_cast<size_t>(std::min_element(best.begin(), best.end()) - best.begin());
    for (int32_t l = num_layers - 1; l >= 0; --l) {
      plan.boundary[static_cast<size_t>(l)] = level[k];
      k = from[static_cast<size_t>(l)][k];
    }
    time_plan(plan, tokens, pairs, costs);
    return plan;
  };

  auto worse = [](const RestorePlan& a, const RestorePlan& b) {
    return std::max(a.compute_seconds, a.load_seconds) >
           std::max(b.compute_seconds, b.load_seconds);
  };
  // Larger lambda: more recomputation. Bisect log(lambda) for the crossing compute = load,
  // keeping the best plan seen.
  RestorePlan best = solve(0.0);
  double lo = -30, hi = 30;  // log lambda
  for (int i = 0; i < 64; ++i) {
    const double mid = 0.5 * (lo + hi);
    RestorePlan plan = solve(std::exp(mid));
    if (worse(best, plan)) best = plan;
    (plan.compute_seconds < plan.load_seconds ? lo : hi) = mid;
  }
  // The weighted sums reach only the corners of the trade-off (with linear costs a layer
  // recomputes all or nothing); the balance lies between the plans on either side of the
  // crossing. When the one recomputing more does so in every layer, walk from the other to it
  // a layer at a time, a level at a time: layers [0, k) at its boundaries, layer k in between,
  // the rest at the other's, which stays non-increasing.
  const RestorePlan less = solve(std::exp(lo)), more = solve(std::exp(hi));
  bool nested = true;
  for (int32_t l = 0; l < num_layers; ++l) nested = nested && more.boundary[l] >= less.boundary[l];
  if (nested) {
    RestorePlan walk = less;
    for (int32_t l = 0; l < num_layers; ++l) {
      for (size_t k = 0; k < levels; ++k) {
        if (level[k] <= less.boundary[l] || level[k] > more.boundary[l]) continue;
        walk.boundary[l] = level[k];
        time_plan(walk, tokens, pairs, costs);
        if (worse(best, walk)) best = walk;
      }
    }
  }
  return best;
}

RestorePlan fixed_ratio_plan(int64_t tokens, int32_t num_layers, double ratio,
                             int64_t granularity) {
  STRATA_CHECK(ratio >= 0 && ratio <= 1 && granularity > 0) << "ratio " << ratio;
  int64_t n = std::llround(ratio * static_cast<double>(tokens) / static_cast<double>(granularity)) *
              granularity;
  n = std::min(n, tokens);
  RestorePlan plan;
  plan.boundary.assign(static_cast<size_t>(num_layers), n);
  return plan;
}

double stored_fraction(const RestorePlan& plan, int64_t tokens, const std::vector<LayerPair>& pairs,
                       const RestoreCosts& costs) {
  if (tokens == 0 || plan.boundary.empty()) return 0.0;
  const std::vector<Role> role = roles(static_cast<int32_t>(plan.boundary.size()), pairs);
  const double merged =
      costs.load_per_token > 0 ? costs.merged_load_per_token / costs.load_per_token : 1.0;
  double stored = 0;
  for (size_t l = 0; l < plan.boundary.size(); ++l) {
    const double rest = static_cast<double>(tokens - plan.boundary[l]);
    if (role[l] == Role::kPlain) stored += rest;
    if (role[l] == Role::kDeep) stored += rest * merged;
  }
  return stored / (static_cast<double>(tokens) * static_cast<double>(plan.boundary.size()));
}

}  // namespace strata::kv::krul
