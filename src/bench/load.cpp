#include "strata/bench/load.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "progress.h"
#include "strata/common/clock.h"

namespace strata::bench {

namespace {

using Clock = SteadyClock;

// Counts free slots of max_concurrency (unlimited when 0).
class Slots {
 public:
  explicit Slots(int64_t limit) : free_(limit), limited_(limit > 0) {}
  void acquire() {
    if (!limited_) return;
    std::unique_lock lock(mutex_);
    freed_.wait(lock, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    if (!limited_) return;
    {
      std::lock_guard lock(mutex_);
      ++free_;
    }
    freed_.notify_one();
  }

 private:
  std::mutex mutex_;
  std::condition_variable freed_;
  int64_t free_;
  const bool limited_;
};

std::optional<Counters> counter_delta(const std::optional<Counters>& before,
                                      const std::optional<Counters>& after) {
  if (!before || !after) return std::nullopt;
  Counters delta;
  for (const auto& [tier, value] : *after) {
    auto it = before->find(tier);
    delta[tier] = value - (it == before->end() ? 0 : it->second);
  }
  return delta;
}

// Starts job(i) for each arrival at its time, holding a slot while it runs, and joins them all.
// Returns the seconds from the first arrival to the end of the last job.
double run_arrivals(int64_t n, const LoadOptions& options, const char* label,
                    const std::function<void(int64_t, Clock::time_point)>& job) {
  const std::vector<double> arrivals = arrival_times(n, options);
  Progress progress(label, n, options.progress);
  Slots slots(options.max_concurrency);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    slots.acquire();
    threads.emplace_back([&, i] {
      job(i, start);
      slots.release();
      progress.advance();
    });
  }
  for (std::thread& thread : threads) thread.join();
  return seconds_since(start);
}

}  // namespace

std::vector<double> arrival_times(int64_t n, const LoadOptions& options) {
  std::vector<double> times(static_cast<size_t>(n), 0.0);
  if (!std::isfinite(options.request_rate) || n == 0) return times;
  // Gaps ~ Gamma(shape = burstiness, scale = 1 / (rate * burstiness)): mean 1 / rate.
  std::mt19937_64 rng(options.seed);
  std::gamma_distribution<double> gap(options.burstiness,
                                      1.0 / (options.request_rate * options.burstiness));
  double t = 0;
  for (double& time : times) {
    time = t;
    t += gap(rng);
  }
  return times;
}

LoadRun run_requests(BenchClient& client, const std::vector<BenchRequest>& requests,
                     const LoadOptions& options) {
  LoadRun run;
  run.results.resize(requests.size());
  const std::optional<TierTokens> before = client.tier_hit_tokens();
  const std::optional<Counters> store_before = client.store_counters();
  run.duration_s = run_arrivals(
      static_cast<int64_t>(requests.size()), options, "requests",
      [&](int64_t i, Clock::time_point start) {
        const double start_s = seconds_since(start);
        run.results[i] = client.send(requests[i], options.ignore_eos);
        run.results[i].start_s = start_s;
      });
  run.tier_hit_tokens = counter_delta(before, client.tier_hit_tokens());
  run.store_counters = counter_delta(store_before, client.store_counters());
  return run;
}

MultiturnRun run_multiturn(BenchClient& client,
                           const std::vector<std::vector<BenchRequest>>& conversations,
                           const MultiturnOptions& options) {
  MultiturnRun run;
  run.results.resize(conversations.size());
  const std::optional<TierTokens> before = client.tier_hit_tokens();
  const std::optional<Counters> store_before = client.store_counters();
  const auto think = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.think_time_s));
  run.duration_s = run_arrivals(
      static_cast<int64_t>(conversations.size()), options.load, "conversations",
      [&](int64_t c, Clock::time_point start) {
        std::vector<std::string> replies;  // the model's answers so far
        for (size_t t = 0; t < conversations[c].size(); ++t) {
          if (t > 0) std::this_thread::sleep_for(think);
          BenchRequest request = conversations[c][t];
          if (options.echo_replies) {
            size_t k = 0;
            for (Message& m : request.messages) {
              if (m.role == "assistant" && k < replies.size()) m.content = replies[k++];
            }
          }
          const double start_s = seconds_since(start);
          RequestResult result = client.send(request, options.load.ignore_eos);
          if (options.echo_replies && result.server_prompt_tokens) {
            result.prompt_len = *result.server_prompt_tokens;
          }
          replies.push_back(result.generated_text);
          result.start_s = start_s;
          const bool failed = !result.success;
          run.results[c].push_back(std::move(result));
          if (failed) break;
        }
      });
  run.tier_hit_tokens = counter_delta(before, client.tier_hit_tokens());
  run.store_counters = counter_delta(store_before, client.store_counters());
  return run;
}

}  // namespace strata::bench
