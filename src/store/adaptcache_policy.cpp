#include "strata/store/adaptcache_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace strata::store::adaptcache {

const char* method_name(Method method) {
  switch (method) {
    case Method::kNone: return "none";
    case Method::kKivi: return "kivi";
    case Method::kStreaming: return "streaming";
    case Method::kLayerMerge:
      return "layer-merge";
  }
  return "unknown";
}

Status Profile::validate() const {
  if (tiers.empty()) return invalid_argument_error("adaptcache: the profile names no tier");
  for (const TierProfile& tier : tiers) {
    if (tier.capacity_bytes < 0 || !(tier.bandwidth > 0) || tier.latency_seconds < 0) {
      return invalid_argument_error("adaptcache: tier '" + tier.name +
                                    "' needs a capacity >= 0, a bandwidth > 0 and a latency >= 0");
    }
  }
  if (codecs.empty() || codecs[0].method != Method::kNone || codecs[0].rate != 1.0) {
    return invalid_argument_error("adaptcache: codecs[0] must be 'none' (rate 1)");
  }
  for (const CodecProfile& codec : codecs) {
    if (!(codec.rate > 0 && codec.rate <= 1) || codec.decode_seconds_per_byte < 0) {
      return invalid_argument_error("adaptcache: codec '" + codec.name +
                                    "' needs a rate in (0, 1] and a decode cost >= 0");
    }
  }
  if (tasks.empty() || quality.size() != tasks.size()) {
    return invalid_argument_error("adaptcache: one quality curve per task, at least one task");
  }
  for (size_t t = 0; t < tasks.size(); ++t) {
    if (quality[t].size() != codecs.size()) {
      return invalid_argument_error("adaptcache: task '" + tasks[t] + "' has " +
                                    std::to_string(quality[t].size()) + " qualities for " +
                                    std::to_string(codecs.size()) + " codecs");
    }
    for (double q : quality[t]) {
      if (!(q >= 0 && q <= 1)) {
        return invalid_argument_error("adaptcache: task '" + tasks[t] + "' has a quality outside [0, 1]");
      }
    }
  }
  if (!(alpha >= 0)) return invalid_argument_error("adaptcache: alpha must be >= 0");
  return Status::ok_status();
}

double utility(const Profile& profile, const Entry& entry, const Option& option) {
  if (option.tier == kEvicted) return entry.frequency * (profile.alpha - entry.prefill_seconds);
  const TierProfile& tier = profile.tiers[option.tier];
  const CodecProfile& codec = profile.codecs[option.codec];
  const double delay = tier.latency_seconds +
                       static_cast<double>(entry.codec_bytes[option.codec]) / tier.bandwidth +
                       static_cast<double>(entry.raw_bytes) * codec.decode_seconds_per_byte;
  return entry.frequency * (profile.alpha * profile.quality[entry.task][option.codec] - delay);
}

bool reachable(const Profile& profile, const Entry& entry, const Option& option) {
  if (option.tier == kEvicted) return true;
  if (option.codec < 0 || option.codec >= static_cast<int32_t>(profile.codecs.size()) ||
      entry.codec_bytes[option.codec] < 0) {
    return false;
  }
  if (entry.current.tier == kEvicted) return false;  // gone: nothing to store again
  // Re-encoding happens in the nearest tier or on the way down: an entry a lower tier holds
  // keeps its codec there (re-encoding would read and rewrite it).
  if (entry.current.tier > 0 && option.tier == entry.current.tier && option.codec != entry.current.codec) {
    return false;
  }
  const CodecProfile& from = profile.codecs[entry.current.codec];
  const CodecProfile& to = profile.codecs[option.codec];
  if (from.method == Method::kNone) return true;
  return to.method == from.method &&
         entry.codec_bytes[option.codec] <= entry.codec_bytes[entry.current.codec];
}

namespace {

int64_t bytes_in(const Entry& entry, const Option& option, int32_t tier) {
  return option.tier == tier ? entry.codec_bytes[option.codec] : 0;
}

// The entry's best option below `tier` (a lower tier in any reachable codec, or eviction).
Option best_below(const Profile& profile, const Entry& entry, int32_t tier) {
  Option best{kEvicted, 0};
  double best_utility = utility(profile, entry, best);
  for (int32_t t = tier + 1; t < static_cast<int32_t>(profile.tiers.size()); ++t) {
    for (int32_t c = 0; c < static_cast<int32_t>(profile.codecs.size()); ++c) {
      const Option option{t, c};
      if (!reachable(profile, entry, option)) continue;
      const double u = utility(profile, entry, option);
      if (u > best_utility) {
        best = option;
        best_utility = u;
      }
    }
  }
  return best;
}

}  // namespace

Plan place(const Profile& profile, const std::vector<Entry>& entries) {
  const int32_t num_tiers = static_cast<int32_t>(profile.tiers.size());
  const int32_t num_codecs = static_cast<int32_t>(profile.codecs.size());
  std::vector<Entry> state = entries;  // current options change as moves apply
  Plan plan;
  plan.tier_bytes.assign(num_tiers, 0);
  for (const Entry& e : state) {
    if (e.current.tier != kEvicted) plan.tier_bytes[e.current.tier] += e.codec_bytes[e.current.codec];
  }
  for (int32_t tier = 0; tier < num_tiers; ++tier) {
    while (plan.tier_bytes[tier] > profile.tiers[tier].capacity_bytes) {
      // The (entry, option) with the least utility drop per byte freed in this tier.
      double best_slope = std::numeric_limits<double>::infinity();
      int64_t best_entry = -1;
      Option best_option;
      for (size_t i = 0; i < state.size(); ++i) {
        const Entry& e = state[i];
        if (e.pinned || e.current.tier != tier) continue;
        const double u_now = utility(profile, e, e.current);
        const int64_t bytes_now = bytes_in(e, e.current, tier);
        auto consider = [&](const Option& option) {
          const int64_t freed = bytes_now - bytes_in(e, option, tier);
          if (freed <= 0) return;
          const double slope = (u_now - utility(profile, e, option)) / static_cast<double>(freed);
          if (slope < best_slope || (slope == best_slope && e.id < state[best_entry].id)) {
            best_slope = slope;
            best_entry = static_cast<int64_t>(i);
            best_option = option;
          }
        };
        for (int32_t c = 0; c < num_codecs; ++c) {
          const Option option{tier, c};
          if (reachable(profile, e, option)) consider(option);
        }
        consider(best_below(profile, e, tier));
      }
      if (best_entry < 0) {
        plan.fits = false;  // only pinned entries are left here
        break;
      }
      Entry& e = state[best_entry];
      plan.moves.push_back({e.id, e.current, best_option});
      if (e.current.tier != kEvicted) plan.tier_bytes[e.current.tier] -= e.codec_bytes[e.current.codec];
      if (best_option.tier != kEvicted) plan.tier_bytes[best_option.tier] += e.codec_bytes[best_option.codec];
      e.current = best_option;
    }
  }
  plan.options.reserve(state.size());
  for (const Entry& e : state) plan.options.push_back(e.current);
  return plan;
}

double decayed_count(const ReuseCount& reuse, double now, double half_life) {
  const double dt = std::max(0.0, now - reuse.at);
  return reuse.count * std::exp2(-dt / half_life);
}

void record_use(ReuseCount* reuse, double now, double half_life) {
  reuse->count = decayed_count(*reuse, now, half_life) + 1.0;
  reuse->at = now;
}

double uses_per_second(const ReuseCount& reuse, double now, double half_life) {
  return decayed_count(reuse, now, half_life) * std::log(2.0) / half_life;
}

}  // namespace strata::store::adaptcache
