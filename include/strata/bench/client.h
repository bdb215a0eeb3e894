// The endpoints `strata bench` drives: an OpenAI-compatible HTTP server (Strata's, vLLM's,
// llama.cpp's...), Strata's gRPC server, or an in-process engine (no network). Every client
// streams, so time to first token and inter-token latencies are measured the same way for all.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/bench/workload.h"
#include "strata/common/ids.h"
#include "strata/common/status.h"

namespace strata::engine {
class Engine;
}
namespace strata::tokenizer {
class ChatTemplate;
class Tokenizer;
}

namespace strata::bench {

// What one request measured. Times are seconds; `start_s` is since the run began.
struct RequestResult {
  bool success = false;
  std::string error;
  int64_t prompt_len = 0;  // the workload's count
  int64_t output_len = 0;  // tokens generated: the server's usage, else the text re-encoded
  double start_s = 0;
  double ttft_s = 0;           // request sent -> first generated text
  std::vector<double> itl_s;   // gaps between streamed chunks after the first
  double latency_s = 0;        // request sent -> end of stream
  std::string generated_text;
  // The prompt as the server counted it (chat template included), and the part it did not
  // compute (prefix cache or KV store), when it says so.
  std::optional<int64_t> server_prompt_tokens;
  std::optional<int64_t> cached_prompt_tokens;
  std::string cached_tier;  // Strata's slowest tier of those ("gpu" | "dram" | "ssd")
};

// Named cumulative counters of the server.
using Counters = std::map<std::string, double>;
// Prompt tokens served from each KV tier ("gpu", "dram", "ssd"), as the engine counts them.
using TierTokens = Counters;
// What the KV store and the scheduler did, by name: "prefetches", "direct_loads",
// "saves_partial", "saves_skipped", "corrupt_chunks", "transcodes", "load_failures",
// "preemptions".
inline constexpr const char* kStoreCounterNames[] = {
    "prefetches", "direct_loads", "saves_partial", "saves_skipped", "corrupt_chunks",
    "transcodes", "load_failures", "preemptions"};

class BenchClient {
 public:
  virtual ~BenchClient() = default;
  // Short description for reports ("openai-chat http://127.0.0.1:8000").
  virtual std::string describe() const = 0;
  // The model name requests carry (asked from the server when not given).
  virtual std::string model_id() const = 0;
  // Checks that the endpoint answers; UNAVAILABLE with the address and the reason otherwise.
  virtual Status probe() = 0;
  // Sends one request and streams its answer; thread-safe. Greedy when `temperature` is 0.
  virtual RequestResult send(const BenchRequest& request, bool ignore_eos) = 0;
  // Scores a prompt (perplexity): the natural-log probability of each token after the first given
  // the tokens before it, one full forward over the whole prompt. OpenAI servers are asked for
  // `echo` with `logprobs` on /v1/completions (llama.cpp's server needs logits_all for it),
  // Strata's gRPC and engine for prompt_logprobs. With decode_tokens > 0 the last decode_tokens
  // tokens are scored by decoding them one step at a time instead (teacher forcing: what a KV
  // cache compressed after the prompt changes); in process only, UNIMPLEMENTED elsewhere.
  // Thread-safe.
  virtual StatusOr<std::vector<double>> score(const std::vector<TokenId>& prompt_token_ids,
                                              int64_t decode_tokens) = 0;
  // Cumulative prompt tokens served per KV tier, when the endpoint exposes them (Strata's
  // /metrics or engine stats); nullopt for peers that do not.
  virtual std::optional<TierTokens> tier_hit_tokens() { return std::nullopt; }
  // Cumulative store counters (kStoreCounterNames), from Strata's /metrics or engine stats (an
  // in-process engine adds "transcodes_<codec>": re-encodings into each lossy codec); nullopt for
  // peers and servers without a KV store.
  virtual std::optional<Counters> store_counters() { return std::nullopt; }
  // Cumulative LeanKV counters of the requests that ended (executor::LeanKvCounts' ended_*
  // fields without the prefix: sequences, high, low, pruned, window, bytes, bf16_bytes), from an
  // in-process engine running LeanKV; nullopt otherwise.
  virtual std::optional<Counters> leankv_counters() { return std::nullopt; }
  // Cumulative FreeKV counters (executor::FreeKvCounts without `sequences`: steps, head_steps,
  // corrected_heads, recalled_pages, reused_pages), from an in-process engine running FreeKV;
  // nullopt otherwise.
  virtual std::optional<Counters> freekv_counters() { return std::nullopt; }
};

struct ClientOptions {
  std::string backend;   // openai | openai-chat | grpc
  std::string base_url;  // http://host:port for OpenAI; host:port (or grpc://host:port) for gRPC
  std::string endpoint;  // OpenAI path; default /v1/completions or /v1/chat/completions
  std::string model;     // empty: the first model the server lists
  std::string api_key;   // sent as a bearer token (OpenAI) or authorization metadata (gRPC)
  // Strata's Prometheus endpoint for tier hits; default {base_url}/metrics for OpenAI backends.
  std::string metrics_url;
  double temperature = 0;
  double request_timeout_s = 600;
};

// An OpenAI-compatible or Strata gRPC client. `tokenizer` counts output tokens when the server
// reports no usage and must outlive the client. INVALID_ARGUMENT for an unknown backend or a
// malformed URL.
StatusOr<std::unique_ptr<BenchClient>> make_remote_client(const ClientOptions& options,
                                                          const tokenizer::Tokenizer& tokenizer);

// Drives `engine` in process: completion requests encode the prompt as `strata generate` does,
// chat requests render `chat_template`. Both must outlive the client.
std::unique_ptr<BenchClient> make_engine_client(engine::Engine& engine,
                                                const tokenizer::ChatTemplate* chat_template,
                                                std::string model_id, double temperature);

}  // namespace strata::bench
