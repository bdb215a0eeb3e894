#include "strata/bench/load.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Answers after `delay`, records how many requests were in flight at once and when each arrived.
class FakeClient final : public BenchClient {
 public:
  explicit FakeClient(std::chrono::milliseconds delay) : delay_(delay) {}
  std::string describe() const override { return "fake"; }
  std::string model_id() const override { return "fake-model"; }
  Status probe() override { return Status(); }
  RequestResult send(const BenchRequest& request, bool) override {
    const int now = ++in_flight_;
    int seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    {
      std::lock_guard lock(mutex_);
      sent_.push_back({request.prompt, Clock::now()});
      requests_.push_back(request);
    }
    std::this_thread::sleep_for(delay_);
    --in_flight_;
    RequestResult result;
    result.success = request.prompt != "fail";
    if (!result.success) result.error = "refused";
    result.prompt_len = request.prompt_len;
    result.output_len = request.max_tokens;
    result.generated_text = "answer to " + request.prompt;
    result.server_prompt_tokens = 100 + request.prompt_len;
    return result;
  }
  StatusOr<std::vector<double>> score(const std::vector<TokenId>&, int64_t) override {
    return unimplemented_error("not scored here");
  }

  int max_in_flight() const { return max_in_flight_; }
  std::vector<std::pair<std::string, Clock::time_point>> sent() const {
    std::lock_guard lock(mutex_);
    return sent_;
  }
  std::vector<BenchRequest> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  const std::chrono::milliseconds delay_;
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, Clock::time_point>> sent_;
  std::vector<BenchRequest> requests_;
};

std::vector<BenchRequest> numbered(int n) {
  std::vector<BenchRequest> requests(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    requests[i].prompt = std::to_string(i);
    requests[i].prompt_len = i;
    requests[i].max_tokens = 1;
  }
  return requests;
}

TEST(ArrivalTimesTest, InfiniteRateSendsEverythingAtOnce) {
  for (double t : arrival_times(5, LoadOptions())) EXPECT_EQ(t, 0.0);
}

TEST(ArrivalTimesTest, GapsHaveTheRateAndBurstinessAsked) {
  for (double burstiness : {1.0, 0.25, 4.0}) {
    LoadOptions options;
    options.request_rate = 8;
    options.burstiness = burstiness;
    options.seed = 3;
    const std::vector<double> times = arrival_times(40001, options);
    EXPECT_EQ(times[0], 0.0);
    double sum = 0, sum_sq = 0;
    for (size_t i = 1; i < times.size(); ++i) {
      const double gap = times[i] - times[i - 1];
      ASSERT_GE(gap, 0.0);
      sum += gap;
      sum_sq += gap * gap;
    }
    const double n = static_cast<double>(times.size() - 1);
    const double mean = sum / n;
    const double cv2 = (sum_sq / n - mean * mean) / (mean * mean);
    EXPECT_NEAR(mean, 1.0 / 8, 0.03 / 8) << "burstiness " << burstiness;
    // Gamma(k): squared coefficient of variation 1 / k (1 for Poisson).
    EXPECT_NEAR(cv2, 1.0 / burstiness, 0.08 / burstiness) << "burstiness " << burstiness;
    EXPECT_EQ(arrival_times(100, options), arrival_times(100, options)) << "seeded";
  }
}

TEST(RunRequestsTest, EveryRequestOnceInOrderWithinTheConcurrencyCap) {
  FakeClient client(std::chrono::milliseconds(20));
  LoadOptions options;
  options.max_concurrency = 3;
  options.progress = false;
  const LoadRun run = run_requests(client, numbered(12), options);
  ASSERT_EQ(run.results.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_TRUE(run.results[i].success);
    EXPECT_EQ(run.results[i].generated_text, "answer to " + std::to_string(i));
  }
  EXPECT_EQ(client.max_in_flight(), 3);
  // 12 requests of 20 ms, 3 at a time: at least 4 rounds.
  EXPECT_GE(run.duration_s, 0.075);
  EXPECT_FALSE(run.tier_hit_tokens) << "the fake exposes no tiers";
}

TEST(RunRequestsTest, ArrivalsFollowTheRate) {
  FakeClient client(std::chrono::milliseconds(1));
  LoadOptions options;
  options.request_rate = 50;
  options.burstiness = 1e6;  // nearly uniform gaps of 20 ms
  options.progress = false;
  const LoadRun run = run_requests(client, numbered(6), options);
  const auto sent = client.sent();
  ASSERT_EQ(sent.size(), 6u);
  const double span = std::chrono::duration<double>(sent.back().second - sent.front().second).count();
  // Request i arrives 20 ms x i after the run starts: never earlier, later only by scheduling
  // delays (bounded loosely). (The first request's own delay can shorten the span between sends,
  // so the lower bound is on each request's start, which counts from the run's start.)
  for (int i = 0; i < 6; ++i) EXPECT_GE(run.results[i].start_s, 0.0198 * i) << "request " << i;
  EXPECT_GT(span, 0.05);
  EXPECT_LT(span, 1.0);
}

TEST(RunMultiturnTest, TurnsRunInOrderAfterThinkTimeAndStopAtAFailure) {
  FakeClient client(std::chrono::milliseconds(5));
  std::vector<std::vector<BenchRequest>> conversations(2);
  for (const char* prompt : {"a1", "a2", "a3"}) conversations[0].push_back({prompt, {}, 1, 1});
  for (const char* prompt : {"b1", "fail", "b3"}) conversations[1].push_back({prompt, {}, 1, 1});
  MultiturnOptions options;
  options.think_time_s = 0.03;
  options.load.progress = false;
  const MultiturnRun run = run_multiturn(client, conversations, options);
  ASSERT_EQ(run.results.size(), 2u);
  ASSERT_EQ(run.results[0].size(), 3u);
  ASSERT_EQ(run.results[1].size(), 2u) << "the conversation stops at its failed turn";
  EXPECT_FALSE(run.results[1][1].success);
  std::vector<Clock::time_point> a;
  for (const auto& [prompt, at] : client.sent()) {
    if (prompt[0] == 'a') a.push_back(at);
  }
  ASSERT_EQ(a.size(), 3u);
  for (size_t t = 1; t < a.size(); ++t) {
    // The previous answer (5 ms) plus the think time (30 ms).
    EXPECT_GE(std::chrono::duration<double>(a[t] - a[t - 1]).count(), 0.034);
  }
}

TEST(RunMultiturnTest, EchoedRepliesReplaceTheRecordedAnswers) {
  // Turn t carries the recorded answers r1..r(t-1); echoed, the model's answers to t1..t(t-1).
  std::vector<std::vector<BenchRequest>> conversations(1);
  std::vector<Message> history;
  for (const char* turn : {"t1", "t2", "t3"}) {
    history.push_back({"user", turn});
    conversations[0].push_back({turn, history, 1, 1});
    history.push_back({"assistant", std::string("recorded after ") + turn});
  }
  for (bool echo : {false, true}) {
    FakeClient client(std::chrono::milliseconds(0));
    MultiturnOptions options;
    options.load.progress = false;
    options.echo_replies = echo;
    const MultiturnRun run = run_multiturn(client, conversations, options);
    const std::vector<BenchRequest> sent = client.requests();
    ASSERT_EQ(sent.size(), 3u);
    ASSERT_EQ(sent[2].messages.size(), 5u);
    EXPECT_EQ(sent[2].messages[0].content, "t1");
    EXPECT_EQ(sent[2].messages[1].content, echo ? "answer to t1" : "recorded after t1");
    EXPECT_EQ(sent[2].messages[3].content, echo ? "answer to t2" : "recorded after t2");
    EXPECT_EQ(sent[2].messages[4].content, "t3");
    EXPECT_EQ(run.results[0][2].prompt_len, echo ? 101 : 1) << "the server's count when echoed";
  }
}

}  // namespace
}  // namespace strata::bench
