// `strata bench`: load generation against a server (serve, multiturn) or the in-process engine
// (offline), with vLLM-compatible flags and result files; `bench compare` is bench_compare.cpp.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench_runs.h"
#include "commands.h"
#include "loaded_model.h"
#include "strata/bench/client.h"
#include "strata/bench/load.h"
#include "strata/bench/quality.h"
#include "strata/bench/report.h"
#include "strata/bench/workload.h"
#include "strata/config/config_loader.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli::bench_runs {

constexpr const char* kUsage =
    R"(usage: strata bench <serve|multiturn|ppl|longqa|offline|compare> [options]

Measures a serving endpoint the way `vllm bench serve` does (same flags where the concept is the
same, same JSON result fields), so results diff against other engines.

  serve       single-turn requests to a running server (Strata's gRPC or any OpenAI-compatible
              HTTP server: Strata, vLLM, llama.cpp, SGLang...)
  multiturn   real multi-turn conversations: each turn resends the history and waits for the
              answer plus a think time; reports TTFT by turn and KV cache hits per tier
  ppl         perplexity of long real text (WikiText-2), scored in strided windows through the
              server's prompt logprobs (OpenAI echo + logprobs, or Strata's prompt_logprobs)
  longqa      long-document QA (L-Eval, BAMBOO): greedy answers scored against the gold ones by
              token F1, ROUGE-L and, for multiple choice, exact match of the option letter
  offline     the serve or multiturn workload against an engine in this process (no network)
  compare     one workload across several engine configurations (in process) and peer servers,
              at one or more request rates: a side-by-side table and PNG plots

Quick start (a server from scripts/run.sh listens on HTTP port 8000 and gRPC port 50051):
  strata bench serve --dataset-name random --num-prompts 50 --max-concurrency 8
  strata bench serve --backend grpc --base-url 127.0.0.1:50051 --dataset-name sharegpt \
      --dataset-path ../shared/data/sharegpt/sharegpt_v3_sample1000.json.xz --request-rate 2
  strata bench multiturn --dataset-path CONVERSATIONS.json.xz --num-prompts 20 --request-rate 0.5
  strata bench offline --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --num-prompts 20
  strata bench ppl --dataset-path ../shared/data/ppl/wikitext-2-raw-v1_test.raw --num-prompts 20
  strata bench longqa --dataset-path ../shared/data/longctx/bamboo/altqa_4k.jsonl.xz

Endpoint (serve, multiturn, ppl, longqa):
  --backend B             openai (/v1/completions; serve and ppl default), openai-chat
                          (/v1/chat/completions; multiturn and longqa default) or grpc
  --base-url URL          http://HOST:PORT for openai*, HOST:PORT for grpc
                          (default http://127.0.0.1:8000, or 127.0.0.1:50051 for grpc)
  --host H, --port P      instead of --base-url
  --endpoint PATH         OpenAI path (default per backend)
  --model NAME            model name sent with requests (default: the server's first model)
  --api-key KEY           bearer token (default: $OPENAI_API_KEY)
  --metrics-url URL       Strata's /metrics, for KV cache hits per tier (default
                          {base-url}/metrics for openai*; none for grpc)
  --request-timeout S     seconds one request may take (default 600)
  --tokenizer PATH        the served model's GGUF file or HF directory, to count tokens
                          (default: .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf)

Workload:
  --dataset-name N        random (default), text or sharegpt (multiturn: always sharegpt)
  --dataset-path FILE     ShareGPT-format .json or .json.xz; for text, a plain text file cut
                          into consecutive prompts (e.g. WikiText-2: long real prompts)
  --num-prompts N         requests (multiturn: conversations); default 1000 (multiturn 100)
  --sharegpt-output-len N output tokens per request instead of the data set's reply length
  --random-input-len N    default 1024     --random-output-len N   default 128
  --random-range-ratio R  lengths uniform in [len*(1-R), len*(1+R)] (default 0)
  --random-prefix-len N   random tokens shared by every prompt (default 0)
  --text-input-len N      default 1024     --text-output-len N     default 128
  --max-turns N           multiturn: at most N turns per conversation (default all)
  --max-output-len N      multiturn: cap on each turn's output tokens (default: the reply's
                          length); longqa: answer tokens at most (default 64)
  --think-time S          multiturn: seconds between an answer and the next turn (default 0)
  --echo-replies          multiturn: later turns carry the model's own answers as the assistant
                          messages (as chat clients send them back), not the dataset's; prompt
                          lengths are then the server's counts
  --temperature T         default 0 (greedy)
  --context-len N         ppl: tokens per scoring window (default 1024)
  --stride N              ppl: tokens between window starts (default context-len / 2); each
                          window scores only the tokens no earlier one did
  --decode-tokens N       ppl: score each window's last N tokens by decoding them one at a time
                          (teacher forcing) instead of as prompt: what KV compression after
                          the prompt changes (LeanKV); in process only (default 0)
  --max-input-len N       longqa: prompt tokens at most; longer documents lose their middle
                          (default 3072)
  (ppl: --num-prompts caps the windows, default 40; longqa: the questions, default 50, in the
  file's order)
  --interleave-documents  longqa: the documents' questions in turns (each one's first question,
                          then each one's second, ...), each document cut once for its longest
                          question: a document's KV waits in the store between its questions
                          (the long-document workload of AdaptCache)
  --ignore-eos            generate exactly the asked output length (always on for random and
                          text)
  --kv-task NAME          Strata's kv_task on every request: the task family AdaptCache weighs
                          its stored KV under (a family of kv_store.adaptcache_profile)

Load:
  --request-rate R        arrivals per second, gamma-distributed gaps (default inf: all at once)
  --burstiness B          gamma shape: 1 = Poisson (default), < 1 burstier
  --max-concurrency N     requests (multiturn: conversations) in flight at most
  --seed N                seeds the workload sampling and the arrival times (default 0)

Results:
  --metric-percentiles L  comma-separated, default 50,90,99
  --goodput SLO           e.g. "ttft:500,tpot:50,e2el:10000" (ms): request_goodput counts
                          requests meeting all of them
  --save-result           write the JSON result file
  --result-dir DIR        where (default .)
  --result-filename F     default {backend}-{rate}qps[-concurrency{N}]-{model}-{date}.json
  --disable-tqdm          no progress bar

Offline and compare (in-process engine): --workload serve|multiturn|ppl|longqa (default serve),
and the
deployment flags of `strata serve`: --model PATH, --config FILE, --device, --dtype,
--set section.key=value, ...

Compare:
  --variant NAME[:K=V,...]  an engine configuration: the deployment plus these overrides, e.g.
                          recompute:kv_cache.enable_prefix_caching=false (repeatable)
  --peer NAME=URL         an OpenAI-compatible server on the same workload, e.g.
                          llama.cpp=http://127.0.0.1:8080 (repeatable)
  --request-rates L       comma-separated rates to sweep (default: --request-rate)
  --output-dir DIR        compare.json, compare.md and the plots (default bench-compare)
  --no-plots              skip the PNG plots (ttft_cdf, ttft_by_turn, throughput_vs_rate)
  --plot-python PATH      Python with matplotlib (default: the project's .venv)
  --warm-store            the runs share kv_store.ssd_dir as it is (not emptied, kept): later
                          runs load the KV earlier ones stored (a long prompt computed once);
                          their TTFTs then measure loads, not prefill
)";

const std::set<std::string>& workload_flag_names() {
  static const std::set<std::string> kNames = {"dataset-name",
                                               "dataset-path",
                                               "num-prompts",
                                               "sharegpt-output-len",
                                               "random-input-len",
                                               "random-output-len",
                                               "random-range-ratio",
                                               "random-prefix-len",
                                               "text-input-len",
                                               "text-output-len",
                                               "max-turns",
                                               "max-output-len",
                                               "think-time",
                                               "temperature",
                                               "request-rate",
                                               "burstiness",
                                               "max-concurrency",
                                               "seed",
                                               "metric-percentiles",
                                               "goodput",
                                               "result-dir",
                                               "result-filename",
                                               "workload",
                                               "context-len",
                                               "stride",
                                               "decode-tokens",
                                               "max-input-len",
                                               "kv-task"};
  return kNames;
}

const std::set<std::string>& endpoint_flag_names() {
  static const std::set<std::string> kNames = {"backend", "base-url", "host", "port", "endpoint",
                                               "model", "api-key", "metrics-url",
                                               "request-timeout", "tokenizer"};
  return kNames;
}

const std::set<std::string>& switch_flag_names() {
  static const std::set<std::string> kNames = {"help", "ignore-eos", "save-result",
                                               "disable-tqdm", "interleave-documents",
                                               "echo-replies"};
  return kNames;
}

StatusOr<std::unique_ptr<tokenizer::Tokenizer>> load_tokenizer(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelSource> source,
                          model::open_model_source(path));
  return open_tokenizer(*source);
}

StatusOr<std::vector<double>> parse_doubles(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || v < 0 || v > 100) {
      return invalid_argument_error("--" + flag + ": '" + item + "' is not a percentile");
    }
    values.push_back(v);
  }
  return values;
}

StatusOr<bench::ReportOptions> report_options(const Flags& flags) {
  bench::ReportOptions options;
  if (flags.has("metric-percentiles")) {
    STRATA_ASSIGN_OR_RETURN(options.percentiles,
                            parse_doubles("metric-percentiles", flags.get("metric-percentiles", "")));
  }
  std::string slo = flags.get("goodput", "");
  for (char& c : slo) {
    if (c == ' ') c = ',';
  }
  std::stringstream in(slo);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string metric = item.substr(0, colon);
    char* end = nullptr;
    const double ms = colon == std::string::npos ? -1 : std::strtod(item.c_str() + colon + 1, &end);
    if ((metric != "ttft" && metric != "tpot" && metric != "e2el") || ms < 0 || *end != '\0') {
      return invalid_argument_error("--goodput: '" + item +
                                    "' is not METRIC:MS with METRIC ttft, tpot or e2el");
    }
    options.goodput_slo_ms[metric] = ms;
  }
  return options;
}

StatusOr<bench::LoadOptions> load_options(const Flags& flags) {
  bench::LoadOptions options;
  if (flags.get("request-rate", "inf") != "inf") {
    STRATA_ASSIGN_OR_RETURN(options.request_rate, flags.get_double("request-rate", 0));
    if (!(options.request_rate > 0)) {
      return invalid_argument_error("--request-rate must be > 0 or inf");
    }
  }
  STRATA_ASSIGN_OR_RETURN(options.burstiness, flags.get_double("burstiness", 1));
  if (!(options.burstiness > 0)) return invalid_argument_error("--burstiness must be > 0");
  STRATA_ASSIGN_OR_RETURN(options.max_concurrency, flags.get_int("max-concurrency", 0));
  if (options.max_concurrency < 0) return invalid_argument_error("--max-concurrency must be >= 0");
  STRATA_ASSIGN_OR_RETURN(int64_t seed, flags.get_int("seed", 0));
  options.seed = static_cast<uint64_t>(seed);
  const std::string dataset = flags.get("dataset-name", "random");
  options.ignore_eos = flags.has("ignore-eos") || dataset == "random" || dataset == "text";
  options.progress = !flags.has("disable-tqdm");
  return options;
}

namespace {

// The requests of build_workload, before their kv_task.
StatusOr<Workload> sample_workload(const Flags& flags, bool multiturn,
                                   const tokenizer::Tokenizer& tok) {
  Workload workload;
  STRATA_ASSIGN_OR_RETURN(int64_t num, flags.get_int("num-prompts", multiturn ? 100 : 1000));
  if (num < 1) return invalid_argument_error("--num-prompts must be >= 1");
  STRATA_ASSIGN_OR_RETURN(int64_t seed, flags.get_int("seed", 0));
  const std::string dataset = flags.get("dataset-name", multiturn ? "sharegpt" : "random");
  if (dataset == "random") {
    if (multiturn) return invalid_argument_error("multiturn needs --dataset-name sharegpt");
    bench::RandomSampling sampling;
    sampling.num_prompts = num;
    sampling.seed = static_cast<uint64_t>(seed);
    STRATA_ASSIGN_OR_RETURN(sampling.input_len, flags.get_int("random-input-len", 1024));
    STRATA_ASSIGN_OR_RETURN(sampling.output_len, flags.get_int("random-output-len", 128));
    STRATA_ASSIGN_OR_RETURN(sampling.range_ratio, flags.get_double("random-range-ratio", 0));
    STRATA_ASSIGN_OR_RETURN(sampling.prefix_len, flags.get_int("random-prefix-len", 0));
    STRATA_ASSIGN_OR_RETURN(workload.requests, bench::random_requests(tok, sampling));
    return workload;
  }
  if (dataset == "text" && !multiturn) {
    if (!flags.has("dataset-path")) {
      return invalid_argument_error("--dataset-name text needs --dataset-path FILE (plain text)");
    }
    bench::TextSampling sampling;
    sampling.num_prompts = num;
    STRATA_ASSIGN_OR_RETURN(sampling.input_len, flags.get_int("text-input-len", 1024));
    STRATA_ASSIGN_OR_RETURN(sampling.output_len, flags.get_int("text-output-len", 128));
    STRATA_ASSIGN_OR_RETURN(const std::string text,
                            bench::read_data_file(flags.get("dataset-path", "")));
    STRATA_ASSIGN_OR_RETURN(workload.requests, bench::text_requests(tok, text, sampling));
    return workload;
  }
  if (dataset != "sharegpt") {
    return invalid_argument_error("--dataset-name must be random, text or sharegpt, got \"" +
                                  dataset + "\"");
  }
  if (!flags.has("dataset-path")) {
    return invalid_argument_error("--dataset-name sharegpt needs --dataset-path FILE (.json or "
                                  ".json.xz in ShareGPT format)");
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<bench::Conversation> conversations,
                          bench::load_sharegpt(flags.get("dataset-path", "")));
  if (!multiturn) {
    bench::SharegptSampling sampling;
    sampling.num_prompts = num;
    sampling.seed = static_cast<uint64_t>(seed);
    STRATA_ASSIGN_OR_RETURN(sampling.output_len, flags.get_int("sharegpt-output-len", 0));
    STRATA_ASSIGN_OR_RETURN(workload.requests, bench::sample_sharegpt(conversations, tok, sampling));
    return workload;
  }
  STRATA_ASSIGN_OR_RETURN(int64_t max_turns, flags.get_int("max-turns", 0));
  STRATA_ASSIGN_OR_RETURN(int64_t max_output_len, flags.get_int("max-output-len", 0));
  // Conversations with at least two user turns (a single turn has no history to reuse), in the
  // data set's order shuffled by the seed.
  std::vector<size_t> order;
  for (size_t i = 0; i < conversations.size(); ++i) {
    if (conversations[i].num_user_turns() >= 2) order.push_back(i);
  }
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::shuffle(order.begin(), order.end(), rng);
  if (static_cast<int64_t>(order.size()) < num) {
    return invalid_argument_error("--num-prompts " + std::to_string(num) + ": the data set has " +
                                  std::to_string(order.size()) +
                                  " conversations with at least two user turns");
  }
  for (int64_t i = 0; i < num; ++i) {
    workload.conversations.push_back(
        bench::conversation_turns(conversations[order[i]], tok, max_turns, max_output_len));
  }
  return workload;
}

}  // namespace

StatusOr<Workload> build_workload(const Flags& flags, bool multiturn,
                                  const tokenizer::Tokenizer& tok) {
  STRATA_ASSIGN_OR_RETURN(Workload workload, sample_workload(flags, multiturn, tok));
  const std::string task = flags.get("kv-task", "");
  for (bench::BenchRequest& r : workload.requests) r.kv_task = task;
  for (std::vector<bench::BenchRequest>& turns : workload.conversations) {
    for (bench::BenchRequest& r : turns) r.kv_task = task;
  }
  return workload;
}

std::string timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d-%H%M%S", &tm);
  return buffer;
}

// Says how many requests of a result failed, and the first one's error.
void print_first_error(const Json& result) {
  const int64_t failed = result["failed"].get<int64_t>();
  for (const Json& error : result["errors"]) {
    if (failed == 0 || error.get<std::string>().empty()) continue;
    std::fprintf(stderr, "%lld requests failed; the first error: %s\n",
                 static_cast<long long>(failed), error.get<std::string>().c_str());
    break;
  }
}

// FreeKV's counters' increase since `before` (null when FreeKV is off), with the share of
// (step, layer, KV head) corrected and of the recall time hidden behind compute.
Json freekv_delta(const std::optional<bench::Counters>& before, bench::BenchClient& client) {
  const std::optional<bench::Counters> after = client.freekv_counters();
  if (!after || !before) return Json();
  Json free;
  for (const auto& [name, value] : *after) free[name] = value - before->at(name);
  const double head_steps = free["head_steps"].get<double>();
  free["corrected_share"] =
      head_steps > 0 ? free["corrected_heads"].get<double>() / head_steps : 0.0;
  const double recall = free["recall_seconds"].get<double>();
  free["recall_hidden_share"] =
      recall > 0 ? 1.0 - free["recall_exposed_seconds"].get<double>() / recall : 0.0;
  return free;
}

StatusOr<Json> run_workload(const Flags& flags, bench::BenchClient& client,
                            const Workload& workload, const bench::LoadOptions& load,
                            const bench::ReportOptions& report, const std::string& backend,
                            const std::string& tokenizer_id) {
  std::fprintf(stderr, "benchmarking %s, model %s\n", client.describe().c_str(),
               client.model_id().c_str());
  Json result;
  const std::optional<bench::Counters> freekv_before = client.freekv_counters();
  if (workload.conversations.empty()) {
    const bench::LoadRun run = bench::run_requests(client, workload.requests, load);
    result = bench::serve_metrics(run.results, run.duration_s, run.tier_hit_tokens, report);
    result["store_counters"] = run.store_counters ? Json(*run.store_counters) : Json();
  } else {
    bench::MultiturnOptions options;
    options.load = load;
    STRATA_ASSIGN_OR_RETURN(options.think_time_s, flags.get_double("think-time", 0));
    if (options.think_time_s < 0) return invalid_argument_error("--think-time must be >= 0");
    options.echo_replies = flags.has("echo-replies");
    result = bench::multiturn_metrics(bench::run_multiturn(client, workload.conversations, options),
                                      report);
    result["echo_replies"] = options.echo_replies;
  }
  if (Json free = freekv_delta(freekv_before, client); !free.is_null()) result["freekv"] = free;
  result["date"] = timestamp();
  result["backend"] = backend;
  result["model_id"] = client.model_id();
  result["tokenizer_id"] = tokenizer_id;
  result["num_prompts"] = workload.conversations.empty() ? workload.requests.size()
                                                         : workload.conversations.size();
  result["request_rate"] = std::isfinite(load.request_rate) ? Json(load.request_rate) : Json("inf");
  result["burstiness"] = load.burstiness;
  result["max_concurrency"] = load.max_concurrency > 0 ? Json(load.max_concurrency) : Json();
  result["dataset_name"] = flags.get("dataset-name", workload.conversations.empty() ? "random"
                                                                                   : "sharegpt");
  print_first_error(result);
  return result;
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return internal_error("cannot write " + path);
  return Status();
}

// With --save-result, writes `result` (which has backend, model_id and date) to --result-dir as
// --result-filename, by default {backend}-{what}-{model}-{date}.json.
Status save_result(const Flags& flags, const Json& result, const std::string& what) {
  if (!flags.has("save-result")) return Status();
  std::string name = flags.get("result-filename", "");
  if (name.empty()) {
    std::string model = result["model_id"].get<std::string>();
    std::replace(model.begin(), model.end(), '/', '_');
    name = result["backend"].get<std::string>() + "-" + what + "-" + model + "-" +
           result["date"].get<std::string>() + ".json";
  }
  // As vLLM's os.path.join(result_dir, file_name): an absolute file name stands alone, and the
  // directory is created when missing.
  const std::filesystem::path path = std::filesystem::path(flags.get("result-dir", ".")) / name;
  std::error_code error;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
  if (error) {
    return internal_error("cannot create " + path.parent_path().string() + ": " + error.message());
  }
  STRATA_RETURN_IF_ERROR(write_file(path.string(), result.dump(2) + "\n"));
  std::fprintf(stderr, "saved %s\n", path.string().c_str());
  return Status();
}

// Runs the workload on `client`, prints the summary and saves the result if asked.
Status run_and_report(const Flags& flags, bench::BenchClient& client, const Workload& workload,
                      const std::string& backend, const std::string& tokenizer_id) {
  STRATA_ASSIGN_OR_RETURN(bench::LoadOptions load, load_options(flags));
  STRATA_ASSIGN_OR_RETURN(bench::ReportOptions report, report_options(flags));
  STRATA_ASSIGN_OR_RETURN(
      Json result, run_workload(flags, client, workload, load, report, backend, tokenizer_id));
  std::fputs(bench::format_summary(result, report).c_str(), stdout);
  std::string rate = result["request_rate"].dump();
  std::erase(rate, '"');
  return save_result(
      flags, result,
      rate + "qps" +
          (load.max_concurrency > 0 ? "-concurrency" + std::to_string(load.max_concurrency) : ""));
}

bool is_quality(const std::string& kind) { return kind == "ppl" || kind == "longqa"; }

StatusOr<QualityWorkload> build_quality_workload(const Flags& flags, const std::string& kind,
                                                 const tokenizer::Tokenizer& tok) {
  if (!flags.has("dataset-path")) {
    return invalid_argument_error(kind == "ppl" ? "ppl needs --dataset-path FILE (plain text, e.g. "
                                                  "../shared/data/ppl/wikitext-2-raw-v1_test.raw)"
                                                : "longqa needs --dataset-path FILE (L-Eval or "
                                                  "BAMBOO .jsonl[.xz])");
  }
  QualityWorkload w;
  w.kind = kind;
  const std::string path = flags.get("dataset-path", "");
  w.setup = {{"task", kind}, {"dataset_path", path}};
  if (kind == "ppl") {
    STRATA_ASSIGN_OR_RETURN(int64_t context_len, flags.get_int("context-len", 1024));
    STRATA_ASSIGN_OR_RETURN(int64_t stride,
                            flags.get_int("stride", std::max<int64_t>(1, context_len / 2)));
    STRATA_ASSIGN_OR_RETURN(int64_t max_windows, flags.get_int("num-prompts", 40));
    STRATA_ASSIGN_OR_RETURN(int64_t decode_tokens, flags.get_int("decode-tokens", 0));
    if (context_len < 2) return invalid_argument_error("--context-len must be >= 2");
    if (decode_tokens < 0 || decode_tokens >= context_len) {
      return invalid_argument_error("--decode-tokens must be in [0, --context-len), got " +
                                    std::to_string(decode_tokens));
    }
    if (max_windows < 1) return invalid_argument_error("--num-prompts must be >= 1");
    STRATA_ASSIGN_OR_RETURN(std::string text, bench::read_data_file(path));
    w.tokens = tok.encode(text, false);
    StatusOr<std::vector<bench::PplWindow>> windows =
        bench::ppl_windows(static_cast<int64_t>(w.tokens.size()), context_len, stride, max_windows);
    if (!windows.ok()) return invalid_argument_error("ppl: " + windows.status().message());
    w.windows = *std::move(windows);
    w.setup["context_len"] = context_len;
    w.setup["stride"] = stride;
    w.setup["decode_tokens"] = decode_tokens;
    return w;
  }
  STRATA_ASSIGN_OR_RETURN(int64_t num, flags.get_int("num-prompts", 50));
  STRATA_ASSIGN_OR_RETURN(int64_t max_input_len, flags.get_int("max-input-len", 3072));
  STRATA_ASSIGN_OR_RETURN(int64_t max_output_len, flags.get_int("max-output-len", 64));
  if (num < 1) return invalid_argument_error("--num-prompts must be >= 1");
  if (max_input_len < 64) return invalid_argument_error("--max-input-len must be >= 64");
  if (max_output_len < 1) return invalid_argument_error("--max-output-len must be >= 1");
  STRATA_ASSIGN_OR_RETURN(bench::QaDataset dataset, bench::load_longqa(path));
  if (dataset.skipped_lines > 0) {
    std::fprintf(stderr, "%s: skipped %lld lines that are not JSON\n", path.c_str(),
                 static_cast<long long>(dataset.skipped_lines));
  }
  // The long-document workload: each document is cut once, for its longest question, so that
  // its questions share it and its stored KV.
  const bool interleave = flags.has("interleave-documents");
  std::map<std::string, int64_t> document_tokens;
  if (interleave) {
    for (const bench::QaItem& item : dataset.items) {
      const int64_t budget = bench::longqa_document_budget(item, tok, max_input_len);
      auto [it, added] = document_tokens.try_emplace(item.context, budget);
      if (!added) it->second = std::min(it->second, budget);
    }
    dataset.items = bench::interleave_documents(std::move(dataset.items));
  }
  if (static_cast<int64_t>(dataset.items.size()) > num) dataset.items.resize(num);
  w.items = std::move(dataset.items);
  for (const bench::QaItem& item : w.items) {
    std::optional<int64_t> cut;
    if (interleave) cut = document_tokens.at(item.context);
    w.requests.push_back(bench::longqa_request(item, tok, max_input_len, max_output_len, cut));
    w.requests.back().kv_task = flags.get("kv-task", "");
  }
  w.setup["max_input_len"] = max_input_len;
  w.setup["interleave_documents"] = flags.has("interleave-documents");
  w.setup["max_output_len"] = max_output_len;
  return w;
}

StatusOr<Json> run_quality(const Flags& flags, bench::BenchClient& client, const QualityWorkload& w,
                           const std::string& backend) {
  std::fprintf(stderr, "%s on %s, model %s\n", w.kind.c_str(), client.describe().c_str(),
               client.model_id().c_str());
  const bool progress = !flags.has("disable-tqdm");
  Json result;
  const std::optional<bench::Counters> leankv_before = client.leankv_counters();
  const std::optional<bench::Counters> freekv_before = client.freekv_counters();
  if (w.kind == "ppl") {
    STRATA_ASSIGN_OR_RETURN(result,
                            bench::run_perplexity(client, w.tokens, w.windows,
                                                  w.setup["decode_tokens"].get<int64_t>(), progress));
  } else {
    bench::LoadOptions load;
    STRATA_ASSIGN_OR_RETURN(load.max_concurrency, flags.get_int("max-concurrency", 0));
    load.ignore_eos = false;
    load.progress = progress;
    result = bench::longqa_metrics(w.items, bench::run_requests(client, w.requests, load));
    print_first_error(result);
  }
  // LeanKV's tiers over the run's requests, and the KV memory they kept against bf16.
  if (const std::optional<bench::Counters> after = client.leankv_counters(); after && leankv_before) {
    Json lean;
    for (const auto& [name, value] : *after) lean[name] = value - leankv_before->at(name);
    const double bf16 = lean["bf16_bytes"].get<double>();
    lean["memory_fraction"] = bf16 > 0 ? lean["bytes"].get<double>() / bf16 : 0.0;
    result["leankv"] = lean;
  }
  if (Json free = freekv_delta(freekv_before, client); !free.is_null()) result["freekv"] = free;
  result.update(w.setup);
  result["date"] = timestamp();
  result["backend"] = backend;
  result["model_id"] = client.model_id();
  return result;
}

std::string quality_summary(const Json& r) {
  char text[512];
  char exact[32] = "-";
  if (r.contains("exact_match") && r["exact_match"].is_number()) {
    std::snprintf(exact, sizeof(exact), "%.4f", r["exact_match"].get<double>());
  }
  if (r["task"] == "ppl") {
    std::snprintf(text, sizeof(text),
                  "============ Perplexity ============\n"
                  "%-32s %s\n%-32s %lld / %lld\n%-32s %lld\n%-32s %.4f\n%-32s %.4f\n"
                  "%-32s %.2f\n",
                  "Text:", r["dataset_path"].get<std::string>().c_str(),
                  "Window / stride:", static_cast<long long>(r["context_len"].get<int64_t>()),
                  static_cast<long long>(r["stride"].get<int64_t>()),
                  "Scored tokens:", static_cast<long long>(r["num_scored_tokens"].get<int64_t>()),
                  "Mean NLL (nats):", r["mean_nll"].get<double>(),
                  "Perplexity:", r["perplexity"].get<double>(),
                  "Duration (s):", r["duration_s"].get<double>());
    return text;
  }
  std::snprintf(text, sizeof(text),
                "============ Long-document QA ============\n"
                "%-32s %s\n%-32s %lld / %lld\n%-32s %.1f\n%-32s %.4f\n%-32s %.4f\n%-32s %s\n"
                "%-32s %.1f\n",
                "Data:", r["dataset_path"].get<std::string>().c_str(),
                "Answered / questions:", static_cast<long long>(r["completed"].get<int64_t>()),
                static_cast<long long>(r["num_questions"].get<int64_t>()),
                "Mean prompt tokens:", r["mean_prompt_len"].get<double>(),
                "Token F1:", r["f1"].get<double>(), "ROUGE-L:", r["rouge_l"].get<double>(),
                "Exact match (choice):", exact,
                "Mean latency (ms):", r["mean_latency_ms"].get<double>());
  return text;
}

// Prints a quality result and saves it when asked.
Status report_quality(const Flags& flags, const Json& result) {
  std::fputs(quality_summary(result).c_str(), stdout);
  return save_result(flags, result, result["task"].get<std::string>());
}

Status bench_remote(const Flags& flags, const std::string& mode) {
  const bool multiturn = mode == "multiturn";
  bench::ClientOptions options;
  options.backend = flags.get("backend", multiturn || mode == "longqa" ? "openai-chat" : "openai");
  const bool grpc = options.backend == "grpc";
  const std::string host = flags.get("host", "127.0.0.1");
  const std::string port = flags.get("port", grpc ? "50051" : "8000");
  if (flags.has("base-url") && (flags.has("host") || flags.has("port"))) {
    return invalid_argument_error("give --base-url, or --host / --port, not both");
  }
  options.base_url = flags.get("base-url", (grpc ? "" : "http://") + host + ":" + port);
  options.endpoint = flags.get("endpoint", "");
  options.model = flags.get("model", "");
  const char* env_key = std::getenv("OPENAI_API_KEY");
  options.api_key = flags.get("api-key", env_key != nullptr ? env_key : "");
  options.metrics_url = flags.get("metrics-url", "");
  STRATA_ASSIGN_OR_RETURN(options.request_timeout_s, flags.get_double("request-timeout", 600));
  STRATA_ASSIGN_OR_RETURN(options.temperature, flags.get_double("temperature", 0));
  const std::string tokenizer_path =
      flags.get("tokenizer", ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                          load_tokenizer(tokenizer_path));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<bench::BenchClient> client,
                          bench::make_remote_client(options, *tok));
  STRATA_RETURN_IF_ERROR(client->probe());
  if (is_quality(mode)) {
    STRATA_ASSIGN_OR_RETURN(QualityWorkload workload, build_quality_workload(flags, mode, *tok));
    STRATA_ASSIGN_OR_RETURN(Json result, run_quality(flags, *client, workload, options.backend));
    return report_quality(flags, result);
  }
  STRATA_ASSIGN_OR_RETURN(Workload workload, build_workload(flags, multiturn, *tok));
  return run_and_report(flags, *client, workload, options.backend, tokenizer_path);
}

StatusOr<std::string> workload_kind(const Flags& flags) {
  const std::string kind = flags.get("workload", "serve");
  if (kind != "serve" && kind != "multiturn" && !is_quality(kind)) {
    return invalid_argument_error("--workload must be serve, multiturn, ppl or longqa, got \"" +
                                  kind + "\"");
  }
  return kind;
}

Status bench_offline(const Flags& flags) {
  STRATA_ASSIGN_OR_RETURN(const std::string kind, workload_kind(flags));
  STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig deployment, deployment_from_flags(flags));
  std::fprintf(stderr, "loading %s ...\n", deployment.model.path.c_str());
  STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(deployment));
  const bool multiturn = kind == "multiturn";
  if ((multiturn || kind == "longqa") && !loaded.chat_template) return loaded.chat_template_error;
  if (is_quality(kind)) {
    STRATA_ASSIGN_OR_RETURN(QualityWorkload workload,
                            build_quality_workload(flags, kind, loaded.engine->tokenizer()));
    std::unique_ptr<bench::BenchClient> client = bench::make_engine_client(
        *loaded.engine, loaded.chat_template ? &*loaded.chat_template : nullptr,
        loaded.engine->model_config().name, 0);
    STRATA_ASSIGN_OR_RETURN(Json result, run_quality(flags, *client, workload, "offline"));
    return report_quality(flags, result);
  }
  STRATA_ASSIGN_OR_RETURN(Workload workload,
                          build_workload(flags, multiturn, loaded.engine->tokenizer()));
  STRATA_ASSIGN_OR_RETURN(double temperature, flags.get_double("temperature", 0));
  std::unique_ptr<bench::BenchClient> client = bench::make_engine_client(
      *loaded.engine, loaded.chat_template ? &*loaded.chat_template : nullptr,
      loaded.engine->model_config().name, temperature);
  return run_and_report(flags, *client, workload, "offline", deployment.model.path);
}

Status bench(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? invalid_argument_error(
                              "give a bench mode: serve, multiturn, ppl, "
                              "longqa, offline or compare")
                        : Status();
  }
  const std::string mode = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  std::set<std::string> value_flags = workload_flag_names();
  std::set<std::string> repeated;
  std::set<std::string> switches = switch_flag_names();
  if (mode == "offline" || mode == "compare") {
    value_flags.insert(deployment_flag_names().begin(), deployment_flag_names().end());
    repeated = deployment_repeated_flag_names();
    if (mode == "compare") {
      value_flags.insert({"request-rates", "output-dir", "plot-python"});
      repeated.insert({"variant", "peer"});
      switches.insert({"no-plots", "warm-store"});
    }
  } else if (mode == "serve" || mode == "multiturn" || is_quality(mode)) {
    value_flags.insert(endpoint_flag_names().begin(), endpoint_flag_names().end());
    value_flags.erase("workload");
  } else {
    return invalid_argument_error("unknown bench mode \"" + mode +
                                  "\" (serve, multiturn, ppl, longqa, offline or compare; see "
                                  "--help)");
  }
  STRATA_ASSIGN_OR_RETURN(Flags flags, Flags::parse(rest, value_flags, switches, repeated));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  if (mode == "offline") return bench_offline(flags);
  if (mode == "compare") return bench_compare(flags, rest);
  return bench_remote(flags, mode);
}

}  // namespace strata::cli::bench_runs

namespace strata::cli {

int run_bench(const std::vector<std::string>& args) {
  return exit_code("strata bench", bench_runs::bench(args));
}

}  // namespace strata::cli
