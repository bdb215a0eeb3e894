// Shared by the bench clients: timing of one streamed answer, URLs, Strata's tier counters read
// from a Prometheus text endpoint, and the per-protocol constructors behind make_remote_client().
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "strata/bench/client.h"

namespace strata::bench {

// Times one request: construct when the request is sent, call on_chunk() for every streamed
// chunk that carries generated tokens (its text may be empty while a UTF-8 sequence or a possible
// stop string is held back), finish() at the end of the stream. The first chunk sets ttft_s,
// each later one appends the gap since the previous chunk to itl_s (as vLLM measures them).
class StreamTiming {
 public:
  using Clock = std::chrono::steady_clock;

  StreamTiming() : sent_(Clock::now()), last_(sent_) {}

  void on_chunk(const std::string& text, RequestResult& result) {
    const Clock::time_point now = Clock::now();
    if (!first_seen_) {
      result.ttft_s = seconds(sent_, now);
      first_seen_ = true;
    } else {
      result.itl_s.push_back(seconds(last_, now));
    }
    last_ = now;
    result.generated_text += text;
  }
  void finish(RequestResult& result) const { result.latency_s = seconds(sent_, Clock::now()); }
  bool first_seen() const { return first_seen_; }

 private:
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  const Clock::time_point sent_;
  Clock::time_point last_;
  bool first_seen_ = false;
};

// strata_kv_tier_hit_tokens_total{tier=...} from the Prometheus text at `url` (http://host:port/
// path); nullopt when the endpoint cannot be read or has no such family (not a Strata server).
std::optional<TierTokens> scrape_tier_hit_tokens(const std::string& url);
// kStoreCounterNames from the same text (strata_kv_store_<name>_total, strata_preemptions_total);
// nullopt when it has none of them.
std::optional<Counters> scrape_store_counters(const std::string& url);

// "http://host:port/prefix" -> {"http://host:port", "/prefix"} (prefix without a trailing "/").
// INVALID_ARGUMENT for anything but an http:// or https:// URL with a host.
struct HttpUrl {
  std::string origin;
  std::string path_prefix;
};
StatusOr<HttpUrl> parse_http_url(const std::string& url);

std::unique_ptr<BenchClient> make_openai_client(const ClientOptions& options, HttpUrl url,
                                                const tokenizer::Tokenizer& tokenizer);
// `target` is host:port.
std::unique_ptr<BenchClient> make_grpc_client(const ClientOptions& options, std::string target);

}  // namespace strata::bench
