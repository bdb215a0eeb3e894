#include "strata/bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

namespace strata::bench {

namespace {

using Json = nlohmann::json;

// "<stat>_<metric>_ms", e.g. "median_ttft_ms" or "p99_ttft_ms" (built by append: GCC 12 warns
// falsely about operator+ chains here).
std::string field(const std::string& stat, const std::string& metric) {
  std::string key = stat;
  key.append("_").append(metric).append("_ms");
  return key;
}

// vLLM's percentile stat names: "p99" for 99, "p99.9" for 99.9 (`prefix` "P" for labels).
std::string percentile_stat(double p, const char* prefix = "p") {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%s%g", prefix, p);
  return buffer;
}

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

double stddev(const std::vector<double>& values) {
  if (values.empty()) return 0;
  const double m = mean(values);
  double sum = 0;
  for (double v : values) sum += (v - m) * (v - m);
  return std::sqrt(sum / static_cast<double>(values.size()));
}

// mean_/median_/std_/p<P>_<name>_ms of `seconds`.
void add_distribution(Json& out, const std::string& name, std::vector<double> seconds,
                      const ReportOptions& options) {
  for (double& s : seconds) s *= 1000;
  out[field("mean", name)] = mean(seconds);
  out[field("median", name)] = percentile(seconds, 50);
  out[field("std", name)] = stddev(seconds);
  for (double p : options.percentiles) out[field(percentile_stat(p), name)] = percentile(seconds, p);
}

double tpot_s(const RequestResult& r) {
  return r.output_len > 1 ? (r.latency_s - r.ttft_s) / static_cast<double>(r.output_len - 1) : 0;
}

bool is_good(const RequestResult& r, const std::map<std::string, double>& slo_ms) {
  for (const auto& [metric, limit_ms] : slo_ms) {
    double value_s = 0;
    if (metric == "ttft") value_s = r.ttft_s;
    if (metric == "tpot") value_s = tpot_s(r);
    if (metric == "e2el") value_s = r.latency_s;
    if (value_s * 1000 > limit_ms) return false;
  }
  return true;
}

// The most requests streaming output at once: between their first token and their end (for a
// server that keeps a request's KV while it decodes, how many conversations fit together).
int64_t max_concurrent_decodes(const std::vector<RequestResult>& results) {
  std::vector<std::pair<double, int>> events;  // (time, +1 first token | -1 end); ends first
  for (const RequestResult& r : results) {
    if (!r.success || r.latency_s <= r.ttft_s) continue;  // never streamed after its first token
    events.emplace_back(r.start_s + r.ttft_s, 1);
    events.emplace_back(r.start_s + r.latency_s, -1);
  }
  std::sort(events.begin(), events.end());
  int64_t now = 0, peak = 0;
  for (const auto& [time, change] : events) peak = std::max(peak, now += change);
  return peak;
}

}  // namespace

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

Json serve_metrics(const std::vector<RequestResult>& results, double duration_s,
                   const std::optional<TierTokens>& tier_hit_tokens,
                   const ReportOptions& options) {
  int64_t completed = 0, good = 0, total_input = 0, total_output = 0, cached = 0;
  int64_t server_prompt = 0;  // of the answers that report it
  std::vector<double> ttfts, tpots, itls, e2els;
  Json input_lens = Json::array(), output_lens = Json::array(), texts = Json::array(),
       errors = Json::array(), ttft_list = Json::array(), itl_list = Json::array();
  for (const RequestResult& r : results) {
    input_lens.push_back(r.prompt_len);
    output_lens.push_back(r.success ? r.output_len : 0);
    texts.push_back(r.generated_text);
    errors.push_back(r.error);
    ttft_list.push_back(r.success ? r.ttft_s : 0.0);
    itl_list.push_back(r.success ? r.itl_s : std::vector<double>{});
    if (!r.success) continue;
    ++completed;
    total_input += r.prompt_len;
    total_output += r.output_len;
    cached += r.cached_prompt_tokens.value_or(0);
    server_prompt += r.server_prompt_tokens.value_or(0);
    ttfts.push_back(r.ttft_s);
    if (r.output_len > 1) tpots.push_back(tpot_s(r));
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    e2els.push_back(r.latency_s);
    if (!options.goodput_slo_ms.empty() && is_good(r, options.goodput_slo_ms)) ++good;
  }
  const double duration = std::max(duration_s, 1e-9);
  Json out;
  out["duration"] = duration_s;
  out["completed"] = completed;
  out["failed"] = static_cast<int64_t>(results.size()) - completed;
  out["total_input_tokens"] = total_input;
  out["total_output_tokens"] = total_output;
  out["request_throughput"] = static_cast<double>(completed) / duration;
  out["request_goodput"] =
      options.goodput_slo_ms.empty() ? Json() : Json(static_cast<double>(good) / duration);
  out["output_throughput"] = static_cast<double>(total_output) / duration;
  out["max_concurrent_decodes"] = max_concurrent_decodes(results);
  out["total_token_throughput"] = static_cast<double>(total_input + total_output) / duration;
  add_distribution(out, "ttft", ttfts, options);
  add_distribution(out, "tpot", tpots, options);
  add_distribution(out, "itl", itls, options);
  add_distribution(out, "e2el", e2els, options);
  out["server_prompt_tokens"] = server_prompt;
  out["cached_prompt_tokens"] = cached;
  out["tier_hit_tokens"] = tier_hit_tokens ? Json(*tier_hit_tokens) : Json();
  out["input_lens"] = std::move(input_lens);
  out["output_lens"] = std::move(output_lens);
  out["ttfts"] = std::move(ttft_list);
  out["itls"] = std::move(itl_list);
  out["generated_texts"] = std::move(texts);
  out["errors"] = std::move(errors);
  return out;
}

Json multiturn_metrics(const MultiturnRun& run, const ReportOptions& options) {
  std::vector<RequestResult> all;
  std::vector<std::vector<const RequestResult*>> by_turn;
  for (const std::vector<RequestResult>& conversation : run.results) {
    for (size_t t = 0; t < conversation.size(); ++t) {
      all.push_back(conversation[t]);
      if (by_turn.size() <= t) by_turn.resize(t + 1);
      by_turn[t].push_back(&conversation[t]);
    }
  }
  Json out = serve_metrics(all, run.duration_s, run.tier_hit_tokens, options);
  Json request_turns = Json::array();  // the turn of each request of the per-request arrays
  for (const std::vector<RequestResult>& conversation : run.results) {
    for (size_t t = 0; t < conversation.size(); ++t) request_turns.push_back(t + 1);
  }
  out["request_turns"] = std::move(request_turns);
  out["store_counters"] = run.store_counters ? Json(*run.store_counters) : Json();
  out["num_conversations"] = run.results.size();
  Json turns = Json::array();
  for (size_t t = 0; t < by_turn.size(); ++t) {
    std::vector<double> ttfts, prompt, cached;
    int64_t failed = 0;
    for (const RequestResult* r : by_turn[t]) {
      if (!r->success) {
        ++failed;
        continue;
      }
      ttfts.push_back(r->ttft_s * 1000);
      prompt.push_back(static_cast<double>(r->server_prompt_tokens.value_or(r->prompt_len)));
      cached.push_back(static_cast<double>(r->cached_prompt_tokens.value_or(0)));
    }
    Json turn = {{"turn", t + 1},
                 {"requests", by_turn[t].size()},
                 {"failed", failed},
                 {"mean_ttft_ms", mean(ttfts)},
                 {"mean_prompt_tokens", mean(prompt)},
                 {"mean_cached_prompt_tokens", mean(cached)}};
    for (double p : options.percentiles) {
      turn[field(percentile_stat(p), "ttft")] = percentile(ttfts, p);
    }
    turns.push_back(std::move(turn));
  }
  out["turns"] = std::move(turns);
  return out;
}

std::string format_summary(const Json& result, const ReportOptions& options) {
  std::string out;
  char line[160];
  auto row = [&](const char* label, const Json& value) {
    if (value.is_null()) return;
    if (value.is_number_integer()) {
      std::snprintf(line, sizeof(line), "%-40s %-10lld\n", label,
                    static_cast<long long>(value.get<int64_t>()));
    } else {
      std::snprintf(line, sizeof(line), "%-40s %-10.2f\n", label, value.get<double>());
    }
    out += line;
  };
  auto header = [&](const std::string& title, char fill) {
    const size_t pad = title.size() < 50 ? 50 - title.size() : 0;
    out += std::string(pad / 2, fill) + title + std::string(pad - pad / 2, fill) + "\n";
  };
  header(" Serving Benchmark Result ", '=');
  row("Successful requests:", result["completed"]);
  row("Failed requests:", result["failed"]);
  row("Benchmark duration (s):", result["duration"]);
  row("Total input tokens:", result["total_input_tokens"]);
  row("Total generated tokens:", result["total_output_tokens"]);
  row("Prompt tokens (server-reported):", result["server_prompt_tokens"]);
  row("Cached prompt tokens (server-reported):", result["cached_prompt_tokens"]);
  row("Request throughput (req/s):", result["request_throughput"]);
  row("Request goodput (req/s):", result["request_goodput"]);
  row("Output token throughput (tok/s):", result["output_throughput"]);
  row("Max concurrent decodes:", result["max_concurrent_decodes"]);
  row("Total Token throughput (tok/s):", result["total_token_throughput"]);
  const std::vector<std::tuple<std::string, std::string, std::string>> metrics = {
      {"ttft", "TTFT", "Time to First Token"},
      {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
      {"itl", "ITL", "Inter-token Latency"},
      {"e2el", "E2EL", "End-to-end Latency"}};
  for (const auto& [key, name, title] : metrics) {
    header(title, '-');
    row(("Mean " + name + " (ms):").c_str(), result[field("mean", key)]);
    row(("Median " + name + " (ms):").c_str(), result[field("median", key)]);
    for (double p : options.percentiles) {
      row((percentile_stat(p, "P") + " " + name + " (ms):").c_str(),
          result[field(percentile_stat(p), key)]);
    }
  }
  if (result.contains("tier_hit_tokens") && result["tier_hit_tokens"].is_object()) {
    header("KV cache hits by tier (prompt tokens)", '-');
    const auto prompt = static_cast<double>(result["server_prompt_tokens"].get<int64_t>());
    for (const char* tier : {"gpu", "dram", "ssd", "remote"}) {  // nearest first
      if (!result["tier_hit_tokens"].contains(tier)) continue;
      const double tokens = result["tier_hit_tokens"][tier].get<double>();
      std::snprintf(line, sizeof(line), "%-40s %-10.0f (%.1f%% of prompt tokens)\n",
                    (std::string(tier) + ":").c_str(), tokens,
                    prompt > 0 ? 100 * tokens / prompt : 0.0);
      out += line;
    }
  }
  if (result.contains("turns")) {
    header("TTFT by turn", '-');
    std::snprintf(line, sizeof(line), "%-6s %-9s %-12s %-12s %-12s %s\n", "turn", "requests",
                  "mean (ms)", "p50 (ms)", "p90 (ms)", "cached/prompt tokens");
    out += line;
    for (const Json& turn : result["turns"]) {
      std::snprintf(line, sizeof(line), "%-6lld %-9lld %-12.1f %-12.1f %-12.1f %.0f/%.0f\n",
                    static_cast<long long>(turn["turn"].get<int64_t>()),
                    static_cast<long long>(turn["requests"].get<int64_t>()),
                    turn["mean_ttft_ms"].get<double>(),
                    turn.value("p50_ttft_ms", 0.0), turn.value("p90_ttft_ms", 0.0),
                    turn["mean_cached_prompt_tokens"].get<double>(),
                    turn["mean_prompt_tokens"].get<double>());
      out += line;
    }
  }
  header("", '=');
  return out;
}

}  // namespace strata::bench
