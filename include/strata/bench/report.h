// Benchmark metrics and reports. Field names follow `vllm bench serve --save-result` so results
// diff against peers: completed, failed, total_input_tokens, total_output_tokens,
// request_throughput, request_goodput, output_throughput, total_token_throughput, input_lens,
// output_lens, ttfts, itls, generated_texts, errors, and for each metric m of ttft, tpot, itl,
// e2el: mean_m_ms, median_m_ms, std_m_ms and p<P>_m_ms for each percentile P. Percentiles
// interpolate linearly (numpy's default); std is the population standard deviation.
//
// TTFT: request sent -> first streamed token. TPOT: (latency - TTFT) / (output tokens - 1), for
// requests with more than one output token. ITL: gaps between streamed chunks. E2EL: latency.
#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "strata/bench/load.h"

namespace strata::bench {

struct ReportOptions {
  std::vector<double> percentiles = {50, 90, 99};
  // Service-level objectives in milliseconds by metric (ttft, tpot, e2el): a request meets them
  // all or it is not "good"; request_goodput counts good requests per second. Empty: no goodput.
  std::map<std::string, double> goodput_slo_ms;
};

// The linear-interpolation percentile p in [0, 100] of `values`; 0 for none.
double percentile(std::vector<double> values, double p);

// Metrics of a set of requests that ran for `duration_s`, vLLM's fields plus Strata's
// server_prompt_tokens and cached_prompt_tokens (sums over the answers that report them) and
// tier_hit_tokens (when known).
nlohmann::json serve_metrics(const std::vector<RequestResult>& results, double duration_s,
                             const std::optional<TierTokens>& tier_hit_tokens,
                             const ReportOptions& options);

// Multi-turn: serve_metrics() over every turn, plus "turns": one entry per turn index (1-based)
// with its request count and TTFT mean and percentiles in ms, mean prompt tokens (the server's
// count when it reports one) and mean cached prompt tokens, and "store_counters" (the KV store's
// counters' increase during the run, when the client can tell; null otherwise).
nlohmann::json multiturn_metrics(const MultiturnRun& run, const ReportOptions& options);

// The human-readable summary printed after a run (vLLM's layout, plus Strata's extras).
std::string format_summary(const nlohmann::json& result, const ReportOptions& options);

}  // namespace strata::bench
