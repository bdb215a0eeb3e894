// `strata bench`: load generation against a server (serve, multiturn) or the in-process engine
// (offline), with vLLM-compatible flags and result files.

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "commands.h"
#include "loaded_model.h"
#include "strata/bench/client.h"
#include "strata/bench/load.h"
#include "strata/bench/report.h"
#include "strata/bench/workload.h"
#include "strata/model/gguf_file.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

using Json = nlohmann::json;

constexpr const char* kUsage = R"(usage: strata bench <serve|multiturn|offline> [options]

Measures a serving endpoint the way `vllm bench serve` does (same flags where the concept is the
same, same JSON result fields), so results diff against other engines.

  serve       single-turn requests to a running server (Strata's gRPC or any OpenAI-compatible
              HTTP server: Strata, vLLM, llama.cpp, SGLang...)
  multiturn   real multi-turn conversations: each turn resends the history and waits for the
              answer plus a think time; reports TTFT by turn and KV cache hits per tier
  offline     the serve or multiturn workload against an engine in this process (no network)

Quick start (a server from scripts/run.sh listens on HTTP port 8000 and gRPC port 50051):
  strata bench serve --dataset-name random --num-prompts 50 --max-concurrency 8
  strata bench serve --backend grpc --base-url 127.0.0.1:50051 --dataset-name sharegpt \
      --dataset-path ../shared/data/sharegpt/sharegpt_v3_sample1000.json.xz --request-rate 2
  strata bench multiturn --dataset-path CONVERSATIONS.json.xz --num-prompts 20 --request-rate 0.5
  strata bench offline --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --num-prompts 20

Endpoint (serve, multiturn):
  --backend B             openai (/v1/completions; serve default), openai-chat
                          (/v1/chat/completions; multiturn default) or grpc (Strata's gRPC)
  --base-url URL          http://HOST:PORT for openai*, HOST:PORT for grpc
                          (default http://127.0.0.1:8000, or 127.0.0.1:50051 for grpc)
  --host H, --port P      instead of --base-url
  --endpoint PATH         OpenAI path (default per backend)
  --model NAME            model name sent with requests (default: the server's first model)
  --api-key KEY           bearer token (default: $OPENAI_API_KEY)
  --metrics-url URL       Strata's /metrics, for KV cache hits per tier (default
                          {base-url}/metrics for openai*; none for grpc)
  --request-timeout S     seconds one request may take (default 600)
  --tokenizer PATH        GGUF file, HF model directory or tokenizer.json that counts tokens
                          (default: .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf)

Workload:
  --dataset-name N        random (default) or sharegpt (multiturn: always sharegpt)
  --dataset-path FILE     ShareGPT-format .json or .json.xz
  --num-prompts N         requests (multiturn: conversations); default 1000 (multiturn 100)
  --sharegpt-output-len N output tokens per request instead of the data set's reply length
  --random-input-len N    default 1024     --random-output-len N   default 128
  --random-range-ratio R  lengths uniform in [len*(1-R), len*(1+R)] (default 0)
  --random-prefix-len N   random tokens shared by every prompt (default 0)
  --max-turns N           multiturn: at most N turns per conversation (default all)
  --max-output-len N      multiturn: cap on each turn's output tokens (default: the reply's length)
  --think-time S          multiturn: seconds between an answer and the next turn (default 0)
  --temperature T         default 0 (greedy)
  --ignore-eos            generate exactly the asked output length (always on for random)

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

Offline (in-process engine): --workload serve|multiturn (default serve), and the deployment
flags of `strata serve`: --model PATH, --config FILE, --device, --dtype, --set key=value, ...
)";

const std::set<std::string>& workload_flag_names() {
  static const std::set<std::string> kNames = {
      "dataset-name", "dataset-path", "num-prompts", "sharegpt-output-len", "random-input-len",
      "random-output-len", "random-range-ratio", "random-prefix-len", "max-turns",
      "max-output-len", "think-time", "temperature", "request-rate", "burstiness",
      "max-concurrency", "seed", "metric-percentiles", "goodput", "result-dir",
      "result-filename", "workload"};
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
                                               "disable-tqdm"};
  return kNames;
}

StatusOr<std::unique_ptr<tokenizer::Tokenizer>> load_tokenizer(const std::string& path) {
  struct stat info{};
  if (::stat(path.c_str(), &info) != 0) {
    return Status(StatusCode::kNotFound,
                  "--tokenizer " + path + ": no such file (give the served model's GGUF file, "
                  "HF directory or tokenizer.json)");
  }
  if (S_ISDIR(info.st_mode)) return tokenizer::Tokenizer::from_tokenizer_json(path + "/tokenizer.json");
  if (path.ends_with(".json")) return tokenizer::Tokenizer::from_tokenizer_json(path);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> gguf, model::GgufFile::open(path));
  return tokenizer::Tokenizer::from_gguf(*gguf);
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
  options.ignore_eos = flags.has("ignore-eos") || flags.get("dataset-name", "random") == "random";
  options.progress = !flags.has("disable-tqdm");
  return options;
}

// The workload: single-turn requests, or each conversation's turns (multiturn).
struct Workload {
  std::vector<bench::BenchRequest> requests;
  std::vector<std::vector<bench::BenchRequest>> conversations;
};

StatusOr<Workload> build_workload(const Flags& flags, bool multiturn,
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
  if (dataset != "sharegpt") {
    return invalid_argument_error("--dataset-name must be random or sharegpt, got \"" + dataset +
                                  "\"");
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

std::string timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d-%H%M%S", &tm);
  return buffer;
}

// Runs the workload on `client`, prints the summary and saves the result if asked.
Status run_and_report(const Flags& flags, bench::BenchClient& client, const Workload& workload,
                      const std::string& backend, const std::string& tokenizer_id) {
  STRATA_ASSIGN_OR_RETURN(bench::LoadOptions load, load_options(flags));
  STRATA_ASSIGN_OR_RETURN(bench::ReportOptions report, report_options(flags));
  std::fprintf(stderr, "benchmarking %s, model %s\n", client.describe().c_str(),
               client.model_id().c_str());
  Json result;
  if (workload.conversations.empty()) {
    const bench::LoadRun run = bench::run_requests(client, workload.requests, load);
    result = bench::serve_metrics(run.results, run.duration_s, run.tier_hit_tokens, report);
  } else {
    bench::MultiturnOptions options;
    options.load = load;
    STRATA_ASSIGN_OR_RETURN(options.think_time_s, flags.get_double("think-time", 0));
    if (options.think_time_s < 0) return invalid_argument_error("--think-time must be >= 0");
    result = bench::multiturn_metrics(bench::run_multiturn(client, workload.conversations, options),
                                      report);
  }
  const std::string date = timestamp();
  result["date"] = date;
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
  std::fputs(bench::format_summary(result, report).c_str(), stdout);
  const int64_t failed = result["failed"].get<int64_t>();
  if (failed > 0) {
    for (const Json& error : result["errors"]) {
      if (error.get<std::string>().empty()) continue;
      std::fprintf(stderr, "%lld requests failed; the first error: %s\n",
                   static_cast<long long>(failed), error.get<std::string>().c_str());
      break;
    }
  }
  if (flags.has("save-result")) {
    std::string name = flags.get("result-filename", "");
    if (name.empty()) {
      std::string model = client.model_id();
      for (char& c : model) {
        if (c == '/') c = '_';
      }
      const std::string rate = std::isfinite(load.request_rate)
                                   ? Json(load.request_rate).dump()
                                   : std::string("inf");
      name = backend + "-" + rate + "qps" +
             (load.max_concurrency > 0 ? "-concurrency" + std::to_string(load.max_concurrency)
                                       : "") +
             "-" + model + "-" + date + ".json";
    }
    const std::string path = flags.get("result-dir", ".") + "/" + name;
    std::ofstream out(path);
    out << result.dump(2) << "\n";
    if (!out) return internal_error("cannot write the result file " + path);
    std::fprintf(stderr, "saved %s\n", path.c_str());
  }
  return Status();
}

Status bench_remote(const Flags& flags, bool multiturn) {
  bench::ClientOptions options;
  options.backend = flags.get("backend", multiturn ? "openai-chat" : "openai");
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
  STRATA_ASSIGN_OR_RETURN(Workload workload, build_workload(flags, multiturn, *tok));
  return run_and_report(flags, *client, workload, options.backend, tokenizer_path);
}

Status bench_offline(const Flags& flags) {
  const std::string kind = flags.get("workload", "serve");
  if (kind != "serve" && kind != "multiturn") {
    return invalid_argument_error("--workload must be serve or multiturn, got \"" + kind + "\"");
  }
  STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig deployment, deployment_from_flags(flags));
  std::fprintf(stderr, "loading %s ...\n", deployment.model.path.c_str());
  STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(deployment));
  const bool multiturn = kind == "multiturn";
  if (multiturn && !loaded.chat_template) return loaded.chat_template_error;
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
    return args.empty() ? invalid_argument_error("give a bench mode: serve, multiturn or offline")
                        : Status();
  }
  const std::string mode = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  std::set<std::string> value_flags = workload_flag_names();
  std::set<std::string> repeated;
  if (mode == "offline") {
    value_flags.insert(deployment_flag_names().begin(), deployment_flag_names().end());
    repeated = deployment_repeated_flag_names();
  } else if (mode == "serve" || mode == "multiturn") {
    value_flags.insert(endpoint_flag_names().begin(), endpoint_flag_names().end());
    value_flags.erase("workload");
  } else {
    return invalid_argument_error("unknown bench mode \"" + mode +
                                  "\" (serve, multiturn or offline; see strata bench --help)");
  }
  STRATA_ASSIGN_OR_RETURN(Flags flags, Flags::parse(rest, value_flags, switch_flag_names(),
                                                    repeated));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  if (mode == "offline") return bench_offline(flags);
  return bench_remote(flags, mode == "multiturn");
}

}  // namespace

int run_bench(const std::vector<std::string>& args) { return exit_code("strata bench", bench(args)); }

}  // namespace strata::cli
