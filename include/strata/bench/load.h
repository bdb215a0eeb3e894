// Load generation for `strata bench`: requests (or conversations) arrive at a fixed rate with
// gamma-distributed gaps (Poisson when burstiness is 1, as in `vllm bench serve`), or all at
// once; at most max_concurrency run at a time. Each request runs on its own thread, so a slow
// answer never delays the next arrival.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "strata/bench/client.h"
#include "strata/bench/workload.h"

namespace strata::bench {

struct LoadOptions {
  // Arrivals per second (requests; conversations for multi-turn); infinity sends all at once.
  double request_rate = std::numeric_limits<double>::infinity();
  // Shape of the gamma distribution of the gaps: 1 is Poisson, < 1 burstier, > 1 more uniform.
  double burstiness = 1;
  int64_t max_concurrency = 0;  // in flight at most (requests; conversations); 0 = unlimited
  uint64_t seed = 0;            // of the arrival times
  bool ignore_eos = false;
  bool progress = true;  // a progress bar on stderr
};

// Gaps' cumulative sums: when each of `n` arrivals happens, in seconds from the start.
std::vector<double> arrival_times(int64_t n, const LoadOptions& options);

struct LoadRun {
  std::vector<RequestResult> results;  // in workload order
  double duration_s = 0;
  // Prompt tokens served per KV tier during the run, when the client can tell.
  std::optional<TierTokens> tier_hit_tokens;
  std::optional<Counters> store_counters;  // their increase during the run, likewise
};

// Sends every request once, as `options` schedule them, and waits for all answers.
LoadRun run_requests(BenchClient& client, const std::vector<BenchRequest>& requests,
                     const LoadOptions& options);

struct MultiturnOptions {
  LoadOptions load;           // request_rate and max_concurrency count conversations
  double think_time_s = 0;    // after an answer, before the next turn is sent
  // Later turns carry the model's own earlier answers as the assistant messages, as a chat client
  // sends them back, instead of the dataset's recorded ones; each result's prompt_len is then
  // the server's count of the prompt's tokens.
  bool echo_replies = false;
};

struct MultiturnRun {
  // results[c][t]: turn t of conversation c; a conversation stops at its first failed turn.
  std::vector<std::vector<RequestResult>> results;
  double duration_s = 0;
  std::optional<TierTokens> tier_hit_tokens;
  std::optional<Counters> store_counters;
};

// Runs each conversation's turns (conversation_turns()) one after another: a turn is sent when
// the previous answer has ended plus the think time.
MultiturnRun run_multiturn(BenchClient& client,
                           const std::vector<std::vector<BenchRequest>>& conversations,
                           const MultiturnOptions& options);

}  // namespace strata::bench
