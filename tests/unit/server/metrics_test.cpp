// Metrics and Histogram: Prometheus text exposition format (0.0.4), bucket placement, engine gauges.
#include "metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace strata::server {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Sample lines ("name{labels} value") by their name-and-labels part.
std::map<std::string, std::string> samples_of(const std::string& text) {
  std::map<std::string, std::string> samples;
  for (const std::string& line : lines_of(text)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    samples[line.substr(0, space)] = line.substr(space + 1);
  }
  return samples;
}

std::string render_histogram(const Histogram& histogram) {
  std::string out;
  histogram.render("h", &out);
  return out;
}

TEST(HistogramTest, EmptyHistogramRendersZeroBucketsEndingInInf) {
  Histogram histogram({0.5, 1, 2.5});
  EXPECT_EQ(render_histogram(histogram),
            "h_bucket{le=\"0.5\"} 0\n"
            "h_bucket{le=\"1\"} 0\n"
            "h_bucket{le=\"2.5\"} 0\n"
            "h_bucket{le=\"+Inf\"} 0\n"
            "h_sum 0\n"
            "h_count 0\n");
}

TEST(HistogramTest, ObservationsLandInCumulativeBuckets) {
  Histogram histogram({0.5, 1, 2.5});
  histogram.observe(0.25);  // <= 0.5
  histogram.observe(0.5);  // bounds are inclusive (le): still the 0.5 bucket
  histogram.observe(0.75);
  histogram.observe(2.5);
  histogram.observe(3);    // only +Inf
  histogram.observe(100);  // only +Inf
  EXPECT_EQ(render_histogram(histogram),
            "h_bucket{le=\"0.5\"} 2\n"
            "h_bucket{le=\"1\"} 3\n"
            "h_bucket{le=\"2.5\"} 4\n"
            "h_bucket{le=\"+Inf\"} 6\n"
            "h_sum 107\n"
            "h_count 6\n");
}

TEST(HistogramTest, NoBoundsHasOnlyInf) {
  Histogram histogram({});
  histogram.observe(4);
  EXPECT_EQ(render_histogram(histogram), "h_bucket{le=\"+Inf\"} 1\nh_sum 4\nh_count 1\n");
}

// Every metric family: "# HELP name ..." then "# TYPE name <type>", then only samples of that
// family; histogram families have cumulative buckets ending in +Inf, then _sum and _count.
void expect_valid_exposition(const std::string& text) {
  ASSERT_FALSE(text.empty());
  ASSERT_EQ(text.back(), '\n');
  const std::regex sample_re(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? )"
      R"(([-+]?[0-9.eE+-]+|NaN|[+-]Inf))");
  const std::vector<std::string> lines = lines_of(text);
  std::string family, type;
  uint64_t last_bucket = 0;
  bool seen_inf = false;
  std::map<std::string, int> families;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    SCOPED_TRACE("line " + std::to_string(i) + ": " + line);
    ASSERT_FALSE(line.empty());
    if (line.starts_with("# HELP ")) {
      family = line.substr(7, line.find(' ', 7) - 7);
      ++families[family];
      ASSERT_LT(i + 1, lines.size());
      ASSERT_TRUE(lines[i + 1].starts_with("# TYPE " + family + " ")) << lines[i + 1];
      type = lines[i + 1].substr(7 + family.size() + 1);
      EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram" ||
                  type == "summary")
          << type;
      if (type == "counter") {
        EXPECT_TRUE(family.ends_with("_total")) << family;
      }
      last_bucket = 0;
      seen_inf = false;
      ++i;
      continue;
    }
    ASSERT_NE(line[0], '#');
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, sample_re));
    const std::string name = match[1];
    if (type == "histogram") {
      if (name == family + "_bucket") {
        EXPECT_FALSE(seen_inf) << "bucket after +Inf";
        const uint64_t value = std::stoull(line.substr(line.rfind(' ') + 1));
        EXPECT_GE(value, last_bucket) << "buckets must be cumulative";
        last_bucket = value;
        if (line.find("le=\"+Inf\"") != std::string::npos) seen_inf = true;
      } else if (name == family + "_sum") {
        EXPECT_TRUE(seen_inf) << "_sum before the +Inf bucket";
      } else {
        ASSERT_EQ(name, family + "_count");
        EXPECT_EQ(std::stoull(line.substr(line.rfind(' ') + 1)), last_bucket)
            << "_count must equal the +Inf bucket";
      }
    } else if (type == "summary") {
      EXPECT_TRUE(name == family + "_sum" || name == family + "_count") << name;
    } else {
      EXPECT_EQ(name, family);
    }
  }
  for (const auto& [name, count] : families) EXPECT_EQ(count, 1) << name << " declared twice";
}

TEST(MetricsTest, FreshMetricsRenderValidExposition) {
  Metrics metrics;
  const std::string text = metrics.render(engine::EngineStats{});
  expect_valid_exposition(text);
  const auto samples = samples_of(text);
  EXPECT_EQ(samples.at("strata_http_client_disconnects_total"), "0");
  EXPECT_EQ(samples.at("strata_time_to_first_token_seconds_count"), "0");
  EXPECT_EQ(samples.at("strata_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), "0");
  EXPECT_EQ(samples.at("strata_kv_pool_usage_ratio"), "0");  // no pool: not a division by zero
  EXPECT_NE(text.find("# TYPE strata_e2e_request_latency_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE strata_num_requests_running gauge\n"), std::string::npos);
}

// A GPU report where the self-check rejected paged attention: the metrics and /health say which
// implementation serves each op and why.
kernels::KernelReport report_with_a_fallback() {
  kernels::KernelReport r;
  r.self_check_seconds = 0.25;
  for (kernels::KernelOp op : kernels::kAllKernelOps) {
    kernels::OpCheck c;
    c.op = op;
    c.backend = kernels::KernelBackend::kStrata;
    c.result = kernels::SelfCheckResult::kPassed;
    c.max_abs_diff = 0.001;
    if (op == kernels::KernelOp::kPagedAttention) {
      c.backend = kernels::KernelBackend::kTorch;
      c.result = kernels::SelfCheckResult::kMismatch;
      c.max_abs_diff = 0.5;
      c.detail = "max |diff| 0.5 above tolerance 0.016";
    }
    r.ops.push_back(c);
  }
  return r;
}

TEST(MetricsTest, KernelChoiceIsExported) {
  const std::string text =
      Metrics().render(engine::EngineStats{}) + render_kernel_metrics(report_with_a_fallback());
  expect_valid_exposition(text);
  const auto samples = samples_of(text);
  EXPECT_EQ(samples.at("strata_kernel_backend{op=\"rms_norm\",backend=\"strata\"}"), "1");
  EXPECT_EQ(samples.at("strata_kernel_backend{op=\"paged_attention\",backend=\"torch\"}"), "1");
  EXPECT_EQ(samples.count("strata_kernel_backend{op=\"paged_attention\",backend=\"strata\"}"), 0u);
  EXPECT_EQ(samples.at("strata_kernel_self_check_failures"), "1");
}

TEST(MetricsTest, HealthNamesEachOpsImplementationAndCheck) {
  const nlohmann::json body = nlohmann::json::parse(health_body(report_with_a_fallback()));
  EXPECT_EQ(body["status"], "ok");
  EXPECT_EQ(body["kernels"]["self_check_seconds"], 0.25);
  ASSERT_EQ(body["kernels"]["ops"].size(), static_cast<size_t>(kernels::kNumKernelOps));
  const nlohmann::json& attention = body["kernels"]["ops"][2];
  EXPECT_EQ(attention["op"], "paged_attention");
  EXPECT_EQ(attention["backend"], "torch");
  EXPECT_EQ(attention["self_check"], "mismatch");
  EXPECT_EQ(attention["max_abs_diff"], 0.5);
  EXPECT_EQ(attention["detail"], "max |diff| 0.5 above tolerance 0.016");
  EXPECT_EQ(body["kernels"]["ops"][0]["self_check"], "passed");
}

TEST(MetricsTest, RecordedCountersAndHistograms) {
  Metrics metrics;
  metrics.count_request("/v1/completions", 200);
  metrics.count_request("/v1/completions", 200);
  metrics.count_request("/v1/completions", 400);
  metrics.count_request("other", 404);
  metrics.count_disconnect();
  metrics.count_tokens(10, 3);
  metrics.count_tokens(5, 7);
  metrics.observe_time_to_first_token(0.03);  // (0.02, 0.04]
  metrics.observe_time_to_first_token(0.04);  // le is inclusive
  metrics.observe_time_to_first_token(100);   // beyond the last bound (80)
  metrics.observe_inter_token_latency(0.012);
  metrics.observe_e2e_latency(1.5);

  const std::string text = metrics.render(engine::EngineStats{});
  expect_valid_exposition(text);
  const auto samples = samples_of(text);
  EXPECT_EQ(samples.at("strata_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"),
            "2");
  EXPECT_EQ(samples.at("strata_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"),
            "1");
  EXPECT_EQ(samples.at("strata_http_requests_total{endpoint=\"other\",status=\"404\"}"), "1");
  EXPECT_EQ(samples.at("strata_http_client_disconnects_total"), "1");
  EXPECT_EQ(samples.at("strata_prompt_tokens_total"), "15");
  EXPECT_EQ(samples.at("strata_generation_tokens_total"), "10");

  const std::string ttft = "strata_time_to_first_token_seconds";
  EXPECT_EQ(samples.at(ttft + "_bucket{le=\"0.02\"}"), "0");
  EXPECT_EQ(samples.at(ttft + "_bucket{le=\"0.04\"}"), "2");
  EXPECT_EQ(samples.at(ttft + "_bucket{le=\"80\"}"), "2");
  EXPECT_EQ(samples.at(ttft + "_bucket{le=\"+Inf\"}"), "3");
  EXPECT_EQ(samples.at(ttft + "_count"), "3");
  EXPECT_NEAR(std::stod(samples.at(ttft + "_sum")), 100.07, 1e-9);

  const std::string itl = "strata_inter_token_latency_seconds";
  EXPECT_EQ(samples.at(itl + "_bucket{le=\"0.01\"}"), "0");
  EXPECT_EQ(samples.at(itl + "_bucket{le=\"0.015\"}"), "1");
  const std::string e2e = "strata_e2e_request_latency_seconds";
  EXPECT_EQ(samples.at(e2e + "_bucket{le=\"1\"}"), "0");
  EXPECT_EQ(samples.at(e2e + "_bucket{le=\"2.5\"}"), "1");
  EXPECT_EQ(samples.at(e2e + "_sum"), "1.5");
}

// Label values must escape backslash, double quote and newline (exposition format 0.0.4).
TEST(MetricsTest, LabelValuesAreEscaped) {
  Metrics metrics;
  metrics.count_request("a\"b\\c\nd", 500);
  const std::string text = metrics.render(engine::EngineStats{});
  EXPECT_NE(text.find("strata_http_requests_total{endpoint=\"a\\\"b\\\\c\\nd\",status=\"500\"} 1\n"),
            std::string::npos)
      << text.substr(0, 300);
  expect_valid_exposition(text);
}

TEST(MetricsTest, EngineGaugesAndCounters) {
  engine::EngineStats stats;
  stats.num_waiting = 3;
  stats.num_running = 5;
  stats.num_swapped = 1;
  stats.kv_blocks_total = 200;
  stats.kv_blocks_available = 150;
  stats.kv_host_blocks_total = 64;
  stats.kv_host_blocks_free = 60;
  stats.prefix_lookup_tokens = 1000;
  stats.prefix_hit_tokens = 400;
  stats.num_preemptions = 7;
  stats.num_swap_outs = 2;
  stats.num_steps = 12345;
  stats.forward_seconds = 2.5;
  stats.collective_seconds = 0.5;
  stats.kv_capacity_bytes = 4 << 20;
  stats.kv_used_bytes = 3 << 20;
  const std::string text = Metrics().render(stats);
  expect_valid_exposition(text);
  const auto samples = samples_of(text);
  EXPECT_EQ(samples.at("strata_num_requests_waiting"), "3");
  EXPECT_EQ(samples.at("strata_num_requests_running"), "5");
  EXPECT_EQ(samples.at("strata_num_requests_swapped"), "1");
  EXPECT_EQ(samples.at("strata_kv_pool_blocks"), "200");
  EXPECT_EQ(samples.at("strata_kv_pool_blocks_available"), "150");
  EXPECT_EQ(samples.at("strata_kv_pool_usage_ratio"), "0.25");
  EXPECT_EQ(samples.at("strata_kv_pool_capacity_bytes"), "4194304");
  EXPECT_EQ(samples.at("strata_kv_pool_used_bytes"), "3145728");
  EXPECT_EQ(samples.at("strata_kv_host_pool_blocks"), "64");
  EXPECT_EQ(samples.at("strata_kv_host_pool_blocks_free"), "60");
  EXPECT_EQ(samples.at("strata_prefix_cache_lookup_tokens_total"), "1000");
  EXPECT_EQ(samples.at("strata_prefix_cache_hit_tokens_total"), "400");
  EXPECT_EQ(samples.at("strata_preemptions_total"), "7");
  EXPECT_EQ(samples.at("strata_swap_outs_total"), "2");
  EXPECT_EQ(samples.at("strata_engine_steps_total"), "12345");
  EXPECT_EQ(samples.at("strata_forward_seconds_total"), "2.5");
  EXPECT_EQ(samples.at("strata_tensor_parallel_collective_seconds_total"), "0.5");
  EXPECT_NE(text.find("# TYPE strata_num_requests_waiting gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE strata_engine_steps_total counter\n"), std::string::npos);
}

TEST(MetricsTest, KvTiersReportHitsBytesEvictionsAndLatency) {
  engine::EngineStats stats;
  stats.prefix_hit_tokens = 64;
  {
    const std::string without_store = Metrics().render(stats);
    EXPECT_EQ(without_store.find("strata_kv_store_"), std::string::npos)
        << "no store, no store families";
    const auto samples = samples_of(without_store);
    EXPECT_EQ(samples.at("strata_kv_tier_hit_tokens_total{tier=\"gpu\"}"), "64")
        << "the device tier is always there";
    EXPECT_FALSE(samples.contains("strata_kv_tier_hit_tokens_total{tier=\"dram\"}"));
  }
  stats.prefix_evicted_blocks = 9;
  stats.store_loaded_tokens = {{"dram", 320}, {"ssd", 48}};
  stats.store_load_failures = 1;
  store::StoreStats& s = stats.store.emplace();
  store::TierStats& dram = s.tiers.emplace_back();
  static_cast<store::TierCounters&>(dram) = {.hits = 5, .misses = 2, .bytes_in = 4096,
                                             .bytes_out = 8192, .evictions = 3,
                                             .load_seconds = 0.5, .loads = 5,
                                             .save_seconds = 0.25, .saves = 4};
  dram.name = "dram";
  store::TierStats& ssd = s.tiers.emplace_back();
  static_cast<store::TierCounters&>(ssd) = {.hits = 1, .misses = 6, .bytes_in = 1024,
                                            .bytes_out = 2048, .evictions = 2,
                                            .load_seconds = 1.5, .loads = 1,
                                            .save_seconds = 0.75, .saves = 2};
  ssd.name = "ssd";
  ssd.used_bytes = 1 << 20;
  ssd.raw_bytes = 3 << 20;
  stats.pool_prefix_hits = 11;
  stats.pool_prefix_misses = 12;
  stats.pool_bytes_loaded = 13;
  stats.pool_bytes_saved = 14;
  stats.pool_load_seconds = 0.125;
  stats.pool_loads = 15;
  stats.pool_save_seconds = 0.0625;
  stats.pool_saves = 16;
  stats.preloads = 3;
  stats.preloaded_layers = 45;
  s.items = 7;
  s.corrupt_chunks = 1;
  s.codec_names = {"none", "kivi-2", "streaming-0.1"};
  s.codec_items = {3, 4, 0};
  s.codec_transcodes = {0, 6, 2};
  const std::string text = Metrics().render(stats);
  expect_valid_exposition(text);
  const auto samples = samples_of(text);
  EXPECT_EQ(samples.at("strata_kv_tier_hit_tokens_total{tier=\"gpu\"}"), "64");
  EXPECT_EQ(samples.at("strata_kv_tier_hit_tokens_total{tier=\"dram\"}"), "320");
  EXPECT_EQ(samples.at("strata_kv_tier_hit_tokens_total{tier=\"ssd\"}"), "48");
  EXPECT_EQ(samples.at("strata_prefix_cache_evicted_blocks_total"), "9");
  EXPECT_EQ(samples.at("strata_kv_store_hits_total{tier=\"dram\"}"), "5");
  EXPECT_EQ(samples.at("strata_kv_store_misses_total{tier=\"ssd\"}"), "6");
  EXPECT_EQ(samples.at("strata_kv_store_bytes_in_total{tier=\"ssd\"}"), "1024");
  EXPECT_EQ(samples.at("strata_kv_store_bytes_out_total{tier=\"dram\"}"), "8192");
  EXPECT_EQ(samples.at("strata_kv_store_evictions_total{tier=\"dram\"}"), "3");
  EXPECT_EQ(samples.at("strata_kv_store_load_seconds_sum{tier=\"ssd\"}"), "1.5");
  EXPECT_EQ(samples.at("strata_kv_store_load_seconds_count{tier=\"dram\"}"), "5");
  EXPECT_EQ(samples.at("strata_kv_store_save_seconds_sum{tier=\"dram\"}"), "0.25");
  EXPECT_EQ(samples.at("strata_kv_store_save_seconds_count{tier=\"ssd\"}"), "2");
  EXPECT_EQ(samples.at("strata_kv_store_codec_items{codec=\"kivi-2\"}"), "4");
  EXPECT_EQ(samples.at("strata_kv_store_codec_transcodes_total{codec=\"streaming-0.1\"}"), "2");
  // The device pool is the hierarchy's top tier.
  EXPECT_EQ(samples.at("strata_kv_store_hits_total{tier=\"gpu\"}"), "11");
  EXPECT_EQ(samples.at("strata_kv_store_misses_total{tier=\"gpu\"}"), "12");
  EXPECT_EQ(samples.at("strata_kv_store_bytes_in_total{tier=\"gpu\"}"), "13");
  EXPECT_EQ(samples.at("strata_kv_store_bytes_out_total{tier=\"gpu\"}"), "14");
  EXPECT_EQ(samples.at("strata_kv_store_evictions_total{tier=\"gpu\"}"), "9");
  EXPECT_EQ(samples.at("strata_kv_store_load_seconds_sum{tier=\"gpu\"}"), "0.125");
  EXPECT_EQ(samples.at("strata_kv_store_load_seconds_count{tier=\"gpu\"}"), "15");
  EXPECT_EQ(samples.at("strata_kv_store_save_seconds_sum{tier=\"gpu\"}"), "0.0625");
  EXPECT_EQ(samples.at("strata_kv_store_save_seconds_count{tier=\"gpu\"}"), "16");
  EXPECT_EQ(samples.at("strata_kv_store_items"), "7");
  EXPECT_EQ(samples.at("strata_kv_store_preloads_total"), "3");
  EXPECT_EQ(samples.at("strata_kv_store_preloaded_layers_total"), "45");
  EXPECT_EQ(samples.at("strata_kv_store_corrupt_chunks_total"), "1");
  EXPECT_EQ(samples.at("strata_kv_store_load_failures_total"), "1");
  EXPECT_EQ(samples.at("strata_kv_store_tier_available{tier=\"ssd\"}"), "1");
  EXPECT_EQ(samples.at("strata_kv_store_used_bytes{tier=\"ssd\"}"), "1048576");
  EXPECT_EQ(samples.at("strata_kv_store_raw_bytes{tier=\"ssd\"}"), "3145728");
  EXPECT_NE(text.find("# TYPE strata_kv_store_load_seconds summary\n"), std::string::npos);
}

TEST(MetricsTest, ConcurrentRecordingLosesNothing) {
  Metrics metrics;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&metrics] {
      for (int i = 0; i < 1000; ++i) {
        metrics.count_request("/health", 200);
        metrics.observe_e2e_latency(0.2);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const auto samples = samples_of(metrics.render(engine::EngineStats{}));
  EXPECT_EQ(samples.at("strata_http_requests_total{endpoint=\"/health\",status=\"200\"}"), "4000");
  EXPECT_EQ(samples.at("strata_e2e_request_latency_seconds_count"), "4000");
  EXPECT_EQ(samples.at("strata_e2e_request_latency_seconds_bucket{le=\"0.25\"}"), "4000");
}

}  // namespace
}  // namespace strata::server
