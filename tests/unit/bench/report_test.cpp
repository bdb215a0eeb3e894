#include "strata/bench/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace strata::bench {
namespace {

RequestResult ok(double ttft_s, double latency_s, int64_t output_len, int64_t prompt_len = 10) {
  RequestResult r;
  r.success = true;
  r.ttft_s = ttft_s;
  r.latency_s = latency_s;
  r.output_len = output_len;
  r.prompt_len = prompt_len;
  for (int64_t i = 1; i < output_len; ++i) {
    r.itl_s.push_back((latency_s - ttft_s) / static_cast<double>(output_len - 1));
  }
  return r;
}

TEST(PercentileTest, InterpolatesLinearlyLikeNumpy) {
  // numpy.percentile([4, 1, 3, 2], q) for q = 0, 50, 90, 99, 100.
  const std::vector<double> values = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(values, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(values, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(values, 90), 3.7);
  EXPECT_NEAR(percentile(values, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(values, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
}

TEST(ServeMetricsTest, VllmFieldsFromKnownRequests) {
  RequestResult failed;
  failed.error = "HTTP 500";
  failed.prompt_len = 7;
  const std::vector<RequestResult> results = {ok(0.1, 1.1, 11), ok(0.3, 0.3, 1), failed};
  ReportOptions options;
  options.percentiles = {50, 99.9};
  const nlohmann::json m = serve_metrics(results, 2.0, std::nullopt, options);
  EXPECT_EQ(m["completed"], 2);
  EXPECT_EQ(m["failed"], 1);
  EXPECT_EQ(m["total_input_tokens"], 20);
  EXPECT_EQ(m["total_output_tokens"], 12);
  EXPECT_DOUBLE_EQ(m["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(m["output_throughput"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(m["total_token_throughput"].get<double>(), 16.0);
  EXPECT_TRUE(m["request_goodput"].is_null()) << "no SLOs, no goodput";
  EXPECT_DOUBLE_EQ(m["mean_ttft_ms"].get<double>(), 200.0);
  EXPECT_NEAR(m["std_ttft_ms"].get<double>(), 100.0, 1e-9) << "population std";
  EXPECT_DOUBLE_EQ(m["median_ttft_ms"].get<double>(), 200.0);
  EXPECT_NEAR(m["p99.9_ttft_ms"].get<double>(), 299.8, 1e-9);
  // TPOT only for requests with more than one output token: (1.1 - 0.1) / 10.
  EXPECT_NEAR(m["mean_tpot_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(m["mean_itl_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(m["p50_e2el_ms"].get<double>(), 700.0, 1e-9);
  EXPECT_EQ(m["input_lens"], nlohmann::json({10, 10, 7}));
  EXPECT_EQ(m["output_lens"], nlohmann::json({11, 1, 0}));
  EXPECT_EQ(m["errors"][2], "HTTP 500");
  EXPECT_EQ(m["itls"][0].size(), 10u);
  for (const char* key : {"duration", "ttfts", "generated_texts", "mean_e2el_ms", "std_itl_ms",
                          "median_tpot_ms", "p50_itl_ms"}) {
    EXPECT_TRUE(m.contains(key)) << key;
  }
}

TEST(ServeMetricsTest, MaxConcurrentDecodesCountsRequestsBetweenFirstTokenAndEnd) {
  auto at = [](double start_s, double ttft_s, double latency_s) {
    RequestResult r = ok(ttft_s, latency_s, 4);
    r.start_s = start_s;
    return r;
  };
  // Decoding over [1, 3], [2, 4], [3.5, 5], [4, 6] and [0.5, 0.5]: at most two at once (one that
  // ends as another starts does not overlap it); a failed request does not count.
  RequestResult failed = at(0, 1, 10);
  failed.success = false;
  const std::vector<RequestResult> results = {at(0, 1, 3), at(1, 1, 3),     at(0, 3.5, 5),
                                              at(4, 0, 2), ok(0.5, 0.5, 1), failed};
  EXPECT_EQ(serve_metrics(results, 6.0, std::nullopt, {})["max_concurrent_decodes"], 2);
  EXPECT_EQ(serve_metrics({at(0, 1, 5), at(0, 2, 5), at(0, 3, 5)}, 5.0, std::nullopt,
                          {})["max_concurrent_decodes"],
            3);
}

TEST(ServeMetricsTest, GoodputCountsRequestsMeetingEverySlo) {
  const std::vector<RequestResult> results = {ok(0.1, 1.1, 11), ok(0.6, 1.6, 11),
                                              ok(0.1, 3.1, 11)};
  ReportOptions options;
  options.goodput_slo_ms = {{"ttft", 500}, {"tpot", 150}};
  const nlohmann::json m = serve_metrics(results, 1.0, std::nullopt, options);
  // The second misses the TTFT SLO, the third the TPOT one (300 ms).
  EXPECT_DOUBLE_EQ(m["request_goodput"].get<double>(), 1.0);
}

TEST(MultiturnMetricsTest, TurnsAreGroupedByIndex) {
  MultiturnRun run;
  run.duration_s = 4;
  RequestResult second = ok(0.05, 0.5, 5, 100);
  second.cached_prompt_tokens = 80;
  second.server_prompt_tokens = 120;
  run.results = {{ok(0.2, 1.0, 5, 30), second}, {ok(0.4, 1.0, 5, 50)}};
  run.tier_hit_tokens = TierTokens{{"gpu", 80}, {"dram", 0}};
  const nlohmann::json m = multiturn_metrics(run, ReportOptions());
  EXPECT_EQ(m["completed"], 3);
  EXPECT_EQ(m["num_conversations"], 2);
  ASSERT_EQ(m["turns"].size(), 2u);
  EXPECT_EQ(m["turns"][0]["requests"], 2);
  EXPECT_NEAR(m["turns"][0]["mean_ttft_ms"].get<double>(), 300.0, 1e-9);
  EXPECT_NEAR(m["turns"][0]["mean_prompt_tokens"].get<double>(), 40.0, 1e-9);
  EXPECT_EQ(m["turns"][1]["requests"], 1);
  EXPECT_NEAR(m["turns"][1]["mean_prompt_tokens"].get<double>(), 120.0, 1e-9)
      << "the server's count when it gives one";
  EXPECT_NEAR(m["turns"][1]["mean_cached_prompt_tokens"].get<double>(), 80.0, 1e-9);
  EXPECT_EQ(m["tier_hit_tokens"]["gpu"], 80.0);
  const std::string summary = format_summary(m, ReportOptions());
  EXPECT_NE(summary.find("TTFT by turn"), std::string::npos);
  EXPECT_NE(summary.find("gpu:"), std::string::npos);
}

}  // namespace
}  // namespace strata::bench
