#include "metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>

namespace strata::server {
namespace {

// Label values in the text exposition format escape backslash, double quote and newline.
std::string escape_label_value(const std::string& value) {
  std::string escaped;
  escaped.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '"') {
      escaped += "\\\"";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

// Bucket bounds in seconds (vLLM's, so dashboards carry over).
const std::vector<double> kTimeToFirstTokenBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                                      0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                                      7.5,   10.0,  20.0, 40.0, 80.0};
const std::vector<double> kInterTokenLatencyBuckets = {
    0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1,   0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5,  5.0};
const std::vector<double> kE2eLatencyBuckets = {0.1,  0.25,  0.5,   1.0,   2.5,  5.0,
                                                10.0, 15.0,  20.0,  30.0,  40.0, 50.0,
                                                60.0, 120.0, 240.0, 480.0, 960.0};

// Shortest text that reads back as `value` ("0.25", "1e-05", "NaN", "+Inf").
std::string format_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, end);
}

void header(std::string* out, std::string_view name, std::string_view type, std::string_view help) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void sample(std::string* out, std::string_view name, double value) {
  out->append(name).append(" ").append(format_number(value)).append("\n");
}

// One family with a `tier` label: {tier, value} samples.
using TierSamples = std::vector<std::pair<std::string, double>>;
void tiered(std::string* out, std::string_view name, std::string_view type, std::string_view help,
            const TierSamples& samples) {
  header(out, name, type, help);
  for (const auto& [tier, value] : samples) {
    out->append(name).append("{tier=\"").append(tier).append("\"} ");
    out->append(format_number(value)).append("\n");
  }
}

// A summary without quantiles, per tier: {tier, sum, count}.
struct TierTotals {
  std::string tier;
  double sum;
  double count;
};
void tiered_summary(std::string* out, std::string_view name, std::string_view help,
                    const std::vector<TierTotals>& totals) {
  header(out, name, "summary", help);
  for (const TierTotals& t : totals) {
    out->append(name).append("_sum{tier=\"").append(t.tier).append("\"} ");
    out->append(format_number(t.sum)).append("\n");
    out->append(name).append("_count{tier=\"").append(t.tier).append("\"} ");
    out->append(format_number(t.count)).append("\n");
  }
}

double d(int64_t v) { return static_cast<double>(v); }

// Prompt tokens per KV tier: the device pool's prefix cache ("gpu", also the CPU pool), and with
// a KV store each of its tiers (CachedAttention), by name.
void render_tier_hits(const engine::EngineStats& engine, std::string* out) {
  TierSamples samples = {{"gpu", d(engine.prefix_hit_tokens)}};
  if (engine.store) {
    for (const store::TierStats& t : engine.store->tiers) {
      samples.emplace_back(t.name, d(engine.loaded_tokens(t.name)));
    }
  }
  tiered(out, "strata_kv_tier_hit_tokens_total", "counter",
         "Prompt tokens whose KV came from each tier instead of being computed.", samples);
}

// Tensor parallelism: every rank's store, each holding its own KV heads (rank 0's is the store
// above; the others' as they last reported, every few seconds).
void render_rank_stores(const engine::EngineStats& engine, std::string* out) {
  std::vector<const store::StoreStats*> ranks = {&*engine.store};
  for (const store::StoreStats& r : engine.rank_stores) ranks.push_back(&r);
  auto per_tier = [&](std::string_view name, std::string_view type, std::string_view help,
                      auto value) {
    header(out, name, type, help);
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (const store::TierStats& t : ranks[r]->tiers) {
        out->append(name).append("{rank=\"").append(std::to_string(r)).append("\",tier=\"");
        out->append(t.name).append("\"} ").append(format_number(value(t))).append("\n");
      }
    }
  };
  auto per_rank = [&](std::string_view name, std::string_view type, std::string_view help,
                      auto value) {
    header(out, name, type, help);
    for (size_t r = 0; r < ranks.size(); ++r) {
      out->append(name).append("{rank=\"").append(std::to_string(r)).append("\"} ");
      out->append(format_number(value(*ranks[r]))).append("\n");
    }
  };
  using T = store::TierStats;
  per_tier("strata_kv_store_rank_chunks", "gauge", "Chunks each rank's store holds per tier.",
           [](const T& t) { return d(t.chunks); });
  per_tier("strata_kv_store_rank_used_bytes", "gauge",
           "Bytes each rank's store holds or reserves per tier, as stored.",
           [](const T& t) { return d(t.used_bytes); });
  per_tier("strata_kv_store_rank_capacity_bytes", "gauge", "Capacity of each rank's tiers.",
           [](const T& t) { return d(t.capacity_bytes); });
  per_tier("strata_kv_store_rank_hits_total", "counter", "Loads each rank's tiers served.",
           [](const T& t) { return d(t.hits); });
  per_tier("strata_kv_store_rank_misses_total", "counter",
           "Lookups each rank's tiers could not serve.", [](const T& t) { return d(t.misses); });
  per_tier("strata_kv_store_rank_tier_available", "gauge",
           "1 while the rank's tier is in use; 0 after it failed.",
           [](const T& t) { return t.available ? 1.0 : 0.0; });
  per_rank("strata_kv_store_rank_items", "gauge", "Conversations each rank's store holds.",
           [](const store::StoreStats& s) { return d(s.items); });
  per_rank("strata_kv_store_rank_corrupt_chunks_total", "counter",
           "Chunks each rank's store found corrupt or unreadable.",
           [](const store::StoreStats& s) { return d(s.corrupt_chunks); });
}

// The KV store's tiers (CachedAttention): the device pool ("gpu": its prefix cache, and the
// store's loads into it and saves out of it), then the store's tiers by name (dram, ssd, ...).
void render_store(const engine::EngineStats& engine, std::string* out) {
  const store::StoreStats& s = *engine.store;
  // {gpu's value, then each store tier's}.
  auto per_tier = [&](double gpu, auto value) {
    TierSamples samples = {{"gpu", gpu}};
    for (const store::TierStats& t : s.tiers) samples.emplace_back(t.name, value(t));
    return samples;
  };
  auto totals = [&](double gpu_sum, int64_t gpu_count, auto value) {
    std::vector<TierTotals> out = {{"gpu", gpu_sum, d(gpu_count)}};
    for (const store::TierStats& t : s.tiers) {
      const auto [sum, count] = value(t);
      out.push_back({t.name, sum, d(count)});
    }
    return out;
  };
  using T = store::TierStats;
  tiered(out, "strata_kv_store_hits_total", "counter",
         "Requests served from each tier (gpu: prompts that found blocks in the prefix cache; "
         "store tiers: loads).",
         per_tier(d(engine.pool_prefix_hits), [](const T& t) { return d(t.hits); }));
  tiered(out, "strata_kv_store_misses_total", "counter", "Lookups each tier could not serve.",
         per_tier(d(engine.pool_prefix_misses), [](const T& t) { return d(t.misses); }));
  tiered(out, "strata_kv_store_bytes_in_total", "counter",
         "Bytes written into each tier as it stores them (gpu: loads from the store; dram: saves "
         "and prefetches; lower tiers: demotions, after their codec).",
         per_tier(d(engine.pool_bytes_loaded), [](const T& t) { return d(t.bytes_in); }));
  tiered(out, "strata_kv_store_bytes_out_total", "counter",
         "Bytes read out of each tier as it stores them (gpu: saves to the store; store tiers: "
         "loads and demotions).",
         per_tier(d(engine.pool_bytes_saved), [](const T& t) { return d(t.bytes_out); }));
  tiered(out, "strata_kv_store_evictions_total", "counter",
         "Moved out of each tier (gpu: prefix cache blocks; store tiers: items).",
         per_tier(d(engine.prefix_evicted_blocks), [](const T& t) { return d(t.evictions); }));
  tiered_summary(out, "strata_kv_store_load_seconds",
                 "Time of loads out of each tier (gpu: per forward pass, inserting loaded KV into "
                 "the pool).",
                 totals(engine.pool_load_seconds, engine.pool_loads,
                        [](const T& t) { return std::pair(t.load_seconds, t.loads); }));
  tiered_summary(out, "strata_kv_store_save_seconds",
                 "Time of writes into each tier (gpu: per forward pass, copying KV out of the "
                 "pool; dram: per saved turn).",
                 totals(engine.pool_save_seconds, engine.pool_saves,
                        [](const T& t) { return std::pair(t.save_seconds, t.saves); }));
  auto store_tiers = [&](auto value) {
    TierSamples samples;
    for (const store::TierStats& t : s.tiers) samples.emplace_back(t.name, value(t));
    return samples;
  };
  tiered(out, "strata_kv_store_chunks", "gauge", "Chunks held per tier.",
         store_tiers([](const T& t) { return d(t.chunks); }));
  tiered(out, "strata_kv_store_used_bytes", "gauge",
         "Bytes held or reserved per tier, as stored (after its codec).",
         store_tiers([](const T& t) { return d(t.used_bytes); }));
  tiered(out, "strata_kv_store_raw_bytes", "gauge",
         "Bytes the chunks each tier holds have before its codec (over used_bytes: the codec's "
         "saving).",
         store_tiers([](const T& t) { return d(t.raw_bytes); }));
  tiered(out, "strata_kv_store_capacity_bytes", "gauge", "Capacity per tier.",
         store_tiers([](const T& t) { return d(t.capacity_bytes); }));
  tiered(out, "strata_kv_store_tier_available", "gauge",
         "1 while the tier is in use; 0 after it failed (remote: from a failed call until one "
         "succeeds).",
         store_tiers([](const T& t) { return t.available ? 1.0 : 0.0; }));
  const std::string_view failures = "strata_kv_store_tier_failures_total";
  header(out, failures, "counter",
         "Why a tier refused values or was unavailable (remote: unreachable, timeout, auth, "
         "protocol, full, too_large, missing, corrupt, error).");
  for (const store::TierStats& t : s.tiers) {
    for (const auto& [reason, n] : t.failures) {
      out->append(failures).append("{tier=\"").append(t.name).append("\",reason=\"");
      out->append(reason).append("\"} ").append(format_number(d(n))).append("\n");
    }
  }
  auto single = [&](std::string_view name, std::string_view type, std::string_view help,
                    double value) {
    header(out, name, type, help);
    sample(out, name, value);
  };
  single("strata_kv_store_items", "gauge", "Conversations with stored KV.", d(s.items));
  single("strata_kv_store_prefetches_total", "counter",
         "Items fetched into DRAM ahead of their queued request.", d(s.prefetches));
  single("strata_kv_store_direct_loads_total", "counter",
         "Loads read from a lower tier straight for the device, without DRAM room.",
         d(s.direct_loads));
  single("strata_kv_store_corrupt_chunks_total", "counter",
         "Chunks that failed their checksum or could not be read (their item was dropped).",
         d(s.corrupt_chunks));
  single("strata_kv_store_load_failures_total", "counter",
         "Requests that recomputed their prompt because a store load failed.",
         d(engine.store_load_failures));
  single("strata_kv_store_saves_skipped_total", "counter",
         "Save attempts that found no DRAM room (asked again on later passes).",
         d(s.saves_skipped));
  single("strata_kv_store_saves_partial_total", "counter",
         "Save reservations that had DRAM room for their leading chunks only.", d(s.saves_partial));
  single("strata_kv_store_saved_tokens_total", "counter",
         "Tokens whose KV finished requests saved to the store.", d(engine.store_saved_tokens));
  single("strata_kv_store_expired_total", "counter", "Items dropped after the TTL.",
         d(s.expired));
  single("strata_kv_store_shared_lookups_total", "counter",
         "Prompts looked up in the remote tier before admission.", d(s.shared_lookups));
  single("strata_kv_store_shared_found_total", "counter",
         "Of those, prompts the remote tier held longer than this replica (another replica's "
         "conversations).",
         d(s.shared_found));
  single("strata_kv_store_transcodes_total", "counter",
         "Items re-encoded to another lossy codec (fixed_codec or AdaptCache).", d(s.transcodes));
  for (const auto& [name, type, help, values] :
       {std::tuple{"strata_kv_store_codec_items", "gauge", "Stored items in each codec.",
                   &s.codec_items},
        std::tuple{"strata_kv_store_codec_transcodes_total", "counter",
                   "Items re-encoded into each lossy codec.", &s.codec_transcodes}}) {
    header(out, name, type, help);
    for (size_t c = 0; c < std::min(values->size(), s.codec_names.size()); ++c) {
      out->append(name).append("{codec=\"").append(s.codec_names[c]).append("\"} ");
      out->append(format_number(d((*values)[c]))).append("\n");
    }
  }
  single("strata_kv_store_preloads_total", "counter",
         "Waiting requests whose first layers of stored KV were pre-loaded (the read buffer).",
         d(engine.preloads));
  single(
      "strata_kv_restore_partial_total", "counter",
      "Resumed turns restored beside their pass, recomputing part of their history (restore_mode "
      "krul or partial).",
      d(engine.partial_restores));
  single("strata_kv_restore_history_token_layers_total", "counter",
         "Their history's tokens times layers.", d(engine.restore_history_token_layers));
  single("strata_kv_restore_recomputed_token_layers_total", "counter",
         "Of those, the token-layers recomputed (the rest were loaded).",
         d(engine.restore_recomputed_token_layers));
  single("strata_kv_restore_pass_seconds_total", "counter",
         "Time of the forward passes that restored a resumed turn.", engine.restore_pass_seconds);
  single("strata_kv_restore_wait_seconds_total", "counter",
         "Of it, the time their layers waited for loaded KV (CPU: the pipeline's bubble).",
         engine.restore_wait_seconds);
  single("strata_kv_layer_pair_maps_total", "counter",
         "Turns that ended with their conversation's layer pairs chosen (kv_store.layer_pairing).",
         d(engine.pair_maps));
  single("strata_kv_paired_layers_total", "counter",
         "Layers those pairs cover, summed (over pair maps x layers: the share of layers paired; "
         "a conversation with fewer pairs than layer_share asks is stored unmerged and adds 0).",
         d(engine.paired_layers));
  single("strata_kv_merged_chunks_loaded_total", "counter",
         "Stored chunks loaded from merged layer pairs (the layer-merge codec).",
         d(engine.merged_chunks_loaded));
  single("strata_kv_suffix_turns_total", "counter",
         "Turns that ended with their conversation's chunks set to keep only the layers its "
         "restoration loads (kv_store.stored_suffix).",
         d(engine.suffix_turns));
  single("strata_kv_suffix_dropped_chunk_layers_total", "counter",
         "The leading layers those chunks leave out below DRAM (chunks x layers, summed).",
         d(engine.suffix_dropped_chunk_layers));
  single("strata_kv_suffix_recomputes_total", "counter",
         "Resumed turns that recomputed their prompt because a stored suffix could not be "
         "restored from position 0 (its first blocks were in the prefix cache).",
         d(engine.suffix_recomputes));
  single("strata_kv_store_preloaded_layers_total", "counter",
         "Layers those pre-loads held, summed (over preloads: the mean read-buffer size).",
         d(engine.preloaded_layers));
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string_view name, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le =
        i < upper_bounds_.size() ? format_number(upper_bounds_[i]) : std::string("+Inf");
    out->append(name).append("_bucket{le=\"").append(le).append("\"} ");
    out->append(std::to_string(cumulative)).append("\n");
  }
  sample(out, std::string(name) + "_sum", sum_);
  sample(out, std::string(name) + "_count", static_cast<double>(count_));
}

Metrics::Metrics()
    : time_to_first_token_(kTimeToFirstTokenBuckets),
      inter_token_latency_(kInterTokenLatencyBuckets),
      e2e_latency_(kE2eLatencyBuckets) {}

void Metrics::count_request(std::string_view endpoint, int http_status) {
  std::scoped_lock lock(mutex_);
  ++requests_[{std::string(endpoint), http_status}];
}

void Metrics::count_disconnect() {
  std::scoped_lock lock(mutex_);
  ++disconnects_;
}

void Metrics::count_tokens(int64_t num_prompt_tokens, int64_t num_generated_tokens) {
  std::scoped_lock lock(mutex_);
  prompt_tokens_ += num_prompt_tokens;
  generated_tokens_ += num_generated_tokens;
}

void Metrics::observe_time_to_first_token(double seconds) {
  std::scoped_lock lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void Metrics::observe_inter_token_latency(double seconds) {
  std::scoped_lock lock(mutex_);
  inter_token_latency_.observe(seconds);
}

void Metrics::observe_e2e_latency(double seconds) {
  std::scoped_lock lock(mutex_);
  e2e_latency_.observe(seconds);
}

std::string Metrics::render(const engine::EngineStats& engine) const {
  std::string out;
  {
    std::scoped_lock lock(mutex_);
    header(&out, "strata_http_requests_total", "counter", "HTTP responses by endpoint and status.");
    for (const auto& [key, count] : requests_) {
      out.append("strata_http_requests_total{endpoint=\"").append(escape_label_value(key.first));
      out.append("\",status=\"").append(std::to_string(key.second)).append("\"} ");
      out.append(std::to_string(count)).append("\n");
    }
    header(&out, "strata_http_client_disconnects_total", "counter",
           "Requests cancelled because their client went away.");
    sample(&out, "strata_http_client_disconnects_total", static_cast<double>(disconnects_));
    header(&out, "strata_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    sample(&out, "strata_prompt_tokens_total", static_cast<double>(prompt_tokens_));
    header(&out, "strata_generation_tokens_total", "counter",
           "Generated tokens of finished requests.");
    sample(&out, "strata_generation_tokens_total", static_cast<double>(generated_tokens_));
    header(&out, "strata_time_to_first_token_seconds", "histogram",
           "Time from submission to the first generated token.");
    time_to_first_token_.render("strata_time_to_first_token_seconds", &out);
    header(&out, "strata_inter_token_latency_seconds", "histogram",
           "Time between consecutive generated tokens of a request.");
    inter_token_latency_.render("strata_inter_token_latency_seconds", &out);
    header(&out, "strata_e2e_request_latency_seconds", "histogram",
           "Time from receiving a generation request to its last token.");
    e2e_latency_.render("strata_e2e_request_latency_seconds", &out);
  }

  auto gauge = [&](std::string_view name, std::string_view help, double value) {
    header(&out, name, "gauge", help);
    sample(&out, name, value);
  };
  auto counter = [&](std::string_view name, std::string_view help, double value) {
    header(&out, name, "counter", help);
    sample(&out, name, value);
  };
  gauge("strata_num_requests_waiting", "Requests queued for their first schedule.",
        static_cast<double>(engine.num_waiting));
  gauge("strata_num_requests_running", "Requests in the running batch.",
        static_cast<double>(engine.num_running));
  gauge("strata_num_requests_swapped", "Preempted requests whose KV is in host memory.",
        static_cast<double>(engine.num_swapped));
  gauge("strata_kv_pool_blocks", "Blocks in the GPU KV pool.", engine.kv_blocks_total);
  gauge("strata_kv_pool_blocks_available", "KV pool blocks free or evictable (prefix cache).",
        engine.kv_blocks_available);
  const double usage =
      engine.kv_blocks_total > 0
          ? 1.0 - static_cast<double>(engine.kv_blocks_available) / engine.kv_blocks_total
          : 0.0;
  gauge("strata_kv_pool_usage_ratio", "Fraction of KV pool blocks held by requests.", usage);
  gauge("strata_kv_pool_capacity_bytes", "Bytes of the GPU KV pool's pages.",
        static_cast<double>(engine.kv_capacity_bytes));
  gauge("strata_kv_pool_used_bytes",
        "Bytes of allocated KV blocks, each in its page format (cached prefix blocks included).",
        static_cast<double>(engine.kv_used_bytes));
  gauge("strata_kv_host_pool_blocks", "Blocks in the host (swap) KV pool.",
        engine.kv_host_blocks_total);
  gauge("strata_kv_host_pool_blocks_free", "Free blocks in the host (swap) KV pool.",
        engine.kv_host_blocks_free);
  const executor::LeanKvCounts& lean = engine.leankv;
  tiered(&out, "strata_leankv_tokens", "gauge",
         "LeanKV tokens stored per precision tier, over every layer and KV head of live requests.",
         {{"high", static_cast<double>(lean.high)}, {"low", static_cast<double>(lean.low)}});
  gauge("strata_leankv_pruned_tokens", "LeanKV tokens pruned from live requests (layer x head).",
        static_cast<double>(lean.pruned));
  gauge("strata_leankv_pages", "Pages of LeanKV's pool.", static_cast<double>(lean.num_pages));
  gauge("strata_leankv_pages_used", "LeanKV pages held by requests.",
        static_cast<double>(lean.pages_used));
  counter("strata_leankv_failed_prompts_total",
          "Prompts LeanKV had no pages or slots for (they decode from the KV pool).",
          static_cast<double>(lean.failed_prompts));
  const executor::FreeKvCounts& free = engine.freekv;
  gauge("strata_freekv_sequences", "Requests decoding by FreeKV's retrieval, off the KV pool.",
        static_cast<double>(free.sequences));
  counter("strata_freekv_refused_sequences_total",
          "Contexts that reached freekv.min_context_tokens but stayed on the KV pool: "
          "freekv.host_bytes was taken.",
          static_cast<double>(free.refused_sequences));
  counter("strata_freekv_head_steps_total",
          "FreeKV decode steps x retrieving layers x KV heads (docs/freekv.md).",
          static_cast<double>(free.head_steps));
  counter("strata_freekv_corrected_heads_total",
          "Of those, KV heads that selected with their step's own query before attending.",
          static_cast<double>(free.corrected_heads));
  counter("strata_freekv_recalled_pages_total",
          "FreeKV (page, KV head) copies from the host pages into the recall buffers.",
          static_cast<double>(free.recalled_pages));
  counter("strata_freekv_reused_pages_total",
          "FreeKV (page, KV head) copies from the previous step's recall buffer (delta recall).",
          static_cast<double>(free.reused_pages));
  counter("strata_freekv_recall_seconds_total",
          "Seconds FreeKV spent selecting and recalling pages for the next step (recall thread) "
          "and for corrected KV heads (step thread).",
          free.recall_seconds);
  counter("strata_freekv_recall_exposed_seconds_total",
          "Of those, seconds the step thread recalled or waited for a recall (not hidden).",
          free.recall_exposed_seconds);
  counter("strata_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(engine.prefix_lookup_tokens));
  counter("strata_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache.",
          static_cast<double>(engine.prefix_hit_tokens));
  counter("strata_prefix_cache_evicted_blocks_total",
          "Cached token blocks (every layer) the prefix cache evicted to make room.",
          static_cast<double>(engine.prefix_evicted_blocks));
  counter("strata_preemptions_total", "Preemptions (swap-outs plus recomputes).",
          static_cast<double>(engine.num_preemptions));
  counter("strata_swap_outs_total", "Preemptions that swapped KV out to host memory.",
          static_cast<double>(engine.num_swap_outs));
  counter("strata_engine_steps_total", "Engine steps run.", static_cast<double>(engine.num_steps));
  counter("strata_forward_seconds_total", "Wall time of the executor's forward passes.",
          engine.forward_seconds);
  counter("strata_tensor_parallel_collective_seconds_total",
          "Of the forward passes, rank 0's time in tensor-parallel collectives (the plan's "
          "broadcast, all-reduces, gathers; waiting for the other ranks included).",
          engine.collective_seconds);
  render_tier_hits(engine, &out);
  if (engine.store) render_store(engine, &out);
  if (engine.store && !engine.rank_stores.empty()) render_rank_stores(engine, &out);
  return out;
}

std::string render_kernel_metrics(const kernels::KernelReport& report) {
  std::string out;
  header(&out, "strata_kernel_backend", "gauge",
         "1 for the implementation (strata or torch) that serves each custom op.");
  int failures = 0;
  for (const kernels::OpCheck& c : report.ops) {
    out.append("strata_kernel_backend{op=\"").append(kernels::kernel_op_name(c.op));
    out.append("\",backend=\"").append(kernels::kernel_backend_name(c.backend)).append("\"} 1\n");
    failures += c.result == kernels::SelfCheckResult::kMismatch;
  }
  header(&out, "strata_kernel_self_check_failures", "gauge",
         "Custom ops whose kernel disagreed with libtorch at start-up (served by libtorch).");
  sample(&out, "strata_kernel_self_check_failures", failures);
  return out;
}

std::string health_body(const kernels::KernelReport& report) {
  nlohmann::json ops = nlohmann::json::array();
  for (const kernels::OpCheck& c : report.ops) {
    ops.push_back({{"op", kernels::kernel_op_name(c.op)},
                   {"backend", kernels::kernel_backend_name(c.backend)},
                   {"self_check", kernels::self_check_result_name(c.result)},
                   {"max_abs_diff", c.max_abs_diff},
                   {"detail", c.detail}});
  }
  const nlohmann::json body = {
      {"status", "ok"},
      {"kernels", {{"self_check_seconds", report.self_check_seconds}, {"ops", std::move(ops)}}}};
  return body.dump();
}

}  // namespace strata::server
