// AdaptCache (Feng, Li et al., 2025; ../shared/papers/adaptcache.md): each stored entry (a
// conversation's or document's KV) gets the compression (method and rate) and the tier that
// serve quality and loading delay best, under the tiers' byte capacities.
//
// Utility of entry e under option o = (tier, codec), the paper's prose form (decision 1 in
// docs/adaptcache.md):
//   U(e, o)     = Freq(e) * (alpha * Q(task(e), codec) - delay(e, o))
//   delay(e, o) = latency(tier) + stored_bytes(e, codec) / bandwidth(tier)
//                 + raw_bytes(e) * decode_seconds_per_byte(codec)
//   U(e, evict) = Freq(e) * (alpha * 1 - prefill_seconds(e))     (a miss recomputes at full quality)
// alpha: seconds of delay one unit of quality is worth; larger alpha keeps more quality.
//
// Placement is the multi-choice knapsack greedy by least marginal utility drop per byte freed,
// tier by tier, nearest tier first: while a tier holds more than its capacity, of every
// (entry in the tier, option that frees bytes there) pair, apply the one with the least
//   (U(e, current) - U(e, option)) / (bytes in the tier now - bytes in the tier after)
// where an option frees bytes by compressing further in the same tier, or by leaving it for the
// entry's best option in the tiers below (or eviction), whose overflow the next pass resolves.
// Taking the least slope over all smaller options walks each entry's upper convex hull, so a
// dominated option (more bytes, less utility) is never the one applied.
//
// Codec transitions (decision 6): an uncompressed entry may take any codec; a compressed one
// keeps its method and may only lower its rate (re-compressing needs no original; the method
// cannot change without it). Codecs change in the nearest tier or on the way down: an entry a
// lower tier holds keeps its codec there. Eviction is always possible; pinned entries stay.
//
// Pure functions over a snapshot: no I/O, no locks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"
#include "strata/store/placement_policy.h"

namespace strata::store::adaptcache {

// How a codec loses information: quantization (KIVI: per-channel keys, per-token values) or
// token dropping (StreamingLLM: attention sinks and a recent window), or not at all.
enum class Method : uint8_t { kNone, kKivi, kStreaming, kLayerMerge };
const char* method_name(Method method);

struct CodecProfile {
  std::string name;  // "none", "kivi-4", "streaming-0.25"
  Method method = Method::kNone;
  double rate = 1.0;  // nominal stored bytes / raw bytes (an entry's exact bytes are its own)
  double decode_seconds_per_byte = 0;  // per raw byte restored
};

struct TierProfile {
  std::string name;
  int64_t capacity_bytes = 0;
  double bandwidth = 0;  // bytes per second to the device
  double latency_seconds = 0;
};

// The estimator's tables (paper §2, "offline profiling"): what the greedy reads.
struct Profile {
  std::vector<TierProfile> tiers;     // nearest first
  std::vector<CodecProfile> codecs;   // codecs[0] is "none": rate 1, quality 1
  std::vector<std::string> tasks;     // task families with a quality curve each
  std::vector<std::vector<double>> quality;  // [task][codec], in [0, 1]
  double alpha = 1.0;

  // INVALID_ARGUMENT naming what is wrong (sizes, ranges, codecs[0]).
  Status validate() const;
};

inline constexpr int32_t kEvicted = -1;

struct Option {
  int32_t tier = kEvicted;  // index into Profile::tiers, or kEvicted
  int32_t codec = 0;        // index into Profile::codecs (ignored when evicted)
  bool operator==(const Option&) const = default;
};

struct Entry {
  ItemId id = 0;
  int64_t raw_bytes = 0;
  // Stored bytes under each codec of the profile (raw_bytes for "none"); < 0: not applicable.
  std::vector<int64_t> codec_bytes;
  double frequency = 0;  // expected reuses per second (ReuseFrequency)
  int32_t task = 0;
  double prefill_seconds = 0;  // recomputing the entry instead of loading it
  Option current;              // where it is, in which codec
  bool pinned = false;         // being read or written: keeps its option
};

double utility(const Profile& profile, const Entry& entry, const Option& option);

// Whether `entry` may move to `option` (codec transitions above; bytes known).
bool reachable(const Profile& profile, const Entry& entry, const Option& option);

struct Move {
  ItemId id = 0;
  Option from;
  Option to;
};

struct Plan {
  std::vector<Move> moves;        // in the order the greedy applied them
  std::vector<Option> options;    // the final option of entries[i]
  std::vector<int64_t> tier_bytes;  // bytes each tier holds under the final options
  bool fits = true;  // false when pinned entries alone overflow a tier
};

// Resolves every tier's overflow from the entries' current options (a new entry arrives with
// its current option in the nearest tier, uncompressed, as the paper places it).
Plan place(const Profile& profile, const std::vector<Entry>& entries);

// The estimated future reuse rate of an entry from its own use history (decision 5): a use
// count decayed with a half-life, c <- c * 2^(-dt / half_life) + 1 at each use, read as
// c * ln 2 / half_life uses per second (the mean of a Poisson process's decayed count). A new
// entry starts at the mean count of the entries it joins (the population prior), or 1.
struct ReuseCount {
  double count = 0;    // decayed uses at `at`
  double at = 0;       // seconds on the caller's clock
};
double decayed_count(const ReuseCount& reuse, double now, double half_life);
void record_use(ReuseCount* reuse, double now, double half_life);
double uses_per_second(const ReuseCount& reuse, double now, double half_life);

}  // namespace strata::store::adaptcache
