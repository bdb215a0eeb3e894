// Private to the HTTP server: the numbers behind GET /metrics, rendered in Prometheus' text
// exposition format (version 0.0.4), and the body of GET /health. Request counters and latency
// histograms are recorded here by the server; the engine's gauges and counters are read from
// Engine::stats() at render time, the kernel choice from the executor's KernelReport.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/engine/engine.h"
#include "strata/kernels/kernel_selection.h"

namespace strata::server {

// Cumulative histogram of non-negative observations, in Prometheus' shape. Thread-compatible.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implicit
  void observe(double value);
  // "<name>_bucket{le=...}", "<name>_sum" and "<name>_count" lines.
  void render(std::string_view name, std::string* out) const;

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;  // [upper_bounds_.size() + 1], not cumulative; last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Thread-safe.
class Metrics {
 public:
  Metrics();

  // One HTTP response. `endpoint` is a route ("/v1/completions") or "other".
  void count_request(std::string_view endpoint, int http_status);
  // A request whose client went away before it finished (it was cancelled).
  void count_disconnect();
  // Per generation request: prompt and generated token counts, and latencies in seconds.
  void count_tokens(int64_t num_prompt_tokens, int64_t num_generated_tokens);
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  void observe_e2e_latency(double seconds);

  // The whole exposition: everything recorded here plus `engine`'s numbers.
  std::string render(const engine::EngineStats& engine) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
  uint64_t disconnects_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t generated_tokens_ = 0;
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram e2e_latency_;
};

// strata_kernel_backend{op,backend} 1 for the implementation serving each custom op, and
// strata_kernel_self_check_failures: ops whose kernel disagreed with libtorch at start-up.
std::string render_kernel_metrics(const kernels::KernelReport& report);

// {"status":"ok","kernels":{"self_check_seconds":S,"ops":[{"op","backend","self_check",
// "max_abs_diff","detail"}, ...]}}
std::string health_body(const kernels::KernelReport& report);

}  // namespace strata::server
