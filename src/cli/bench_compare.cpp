// `strata bench compare`: one workload on several configurations of the in-process engine (a
// fresh engine per run) and on peer servers, side by side in compare.md / compare.json and plots.

#include <dirent.h>
#include <sys/stat.h>  // mkdir
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "bench_runs.h"
#include "loaded_model.h"
#include "strata/bench/client.h"
#include "strata/config/config_loader.h"

namespace strata::cli::bench_runs {
namespace {

// "NAME[:section.key=value,...]" -> name and overrides. An item without '=' continues the
// previous value after a comma, so a value may hold commas:
// "k8v4:kv_cache.page_format=k:int8/token64,v:int4/token64".
struct Variant {
  std::string name;
  std::vector<std::pair<std::string, std::string>> overrides;
};

StatusOr<Variant> parse_variant(const std::string& spec) {
  Variant variant;
  const size_t colon = spec.find(':');
  variant.name = spec.substr(0, colon);
  if (variant.name.empty()) return invalid_argument_error("--variant " + spec + ": no name");
  if (colon == std::string::npos) return variant;
  std::stringstream in(spec.substr(colon + 1));
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    if (eq != std::string::npos) {
      variant.overrides.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    } else if (!variant.overrides.empty()) {
      variant.overrides.back().second += "," + item;
    } else {
      return invalid_argument_error("--variant " + spec + ": '" + item +
                                    "' is not section.key=value");
    }
  }
  return variant;
}

StatusOr<std::vector<double>> parse_rates(const Flags& flags) {
  std::vector<double> rates;
  std::stringstream in(flags.get("request-rates", flags.get("request-rate", "inf")));
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double rate =
        item == "inf" ? std::numeric_limits<double>::infinity() : std::strtod(item.c_str(), &end);
    if (item != "inf" && (item.empty() || *end != '\0' || !(rate > 0))) {
      return invalid_argument_error("--request-rates: '" + item + "' is not a rate > 0 or inf");
    }
    rates.push_back(rate);
  }
  return rates;
}

std::string one_decimal(double ms) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", ms);
  return buffer;
}

// One row of the side-by-side table.
std::string compare_row(const std::string& variant, const Json& r) {
  auto ms = [&](const char* key) { return r.value(key, 0.0); };
  double later_sum = 0, later_count = 0;  // turns after the first, weighted by requests
  if (r.contains("turns")) {
    for (const Json& turn : r["turns"]) {
      if (turn["turn"].get<int64_t>() < 2) continue;
      const double n =
          static_cast<double>(turn["requests"].get<int64_t>() - turn["failed"].get<int64_t>());
      later_sum += turn["mean_ttft_ms"].get<double>() * n;
      later_count += n;
    }
  }
  auto tier = [&](const char* name) -> std::string {
    if (!r["tier_hit_tokens"].is_object() || !r["tier_hit_tokens"].contains(name)) return "-";
    return std::to_string(static_cast<int64_t>(r["tier_hit_tokens"][name].get<double>()));
  };
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "| %s | %s | %lld/%lld | %.2f | %.1f | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %s "
      "| %s | %s | %s | %s |\n",
      variant.c_str(),
      r["request_rate"].is_string() ? r["request_rate"].get<std::string>().c_str()
                                    : r["request_rate"].dump().c_str(),
      static_cast<long long>(r["completed"].get<int64_t>()),
      static_cast<long long>(r["completed"].get<int64_t>() + r["failed"].get<int64_t>()),
      r["request_throughput"].get<double>(), r["output_throughput"].get<double>(),
      static_cast<long long>(r["max_concurrent_decodes"].get<int64_t>()), ms("mean_ttft_ms"),
      ms("median_ttft_ms"), ms("p90_ttft_ms"), ms("p99_ttft_ms"), ms("mean_tpot_ms"),
      later_count > 0 ? one_decimal(later_sum / later_count).c_str() : "-", tier("gpu").c_str(),
      tier("dram").c_str(), tier("ssd").c_str(), tier("remote").c_str());
  return line;
}

// One row of the side-by-side table of a quality workload.
std::string quality_row(const std::string& variant, const Json& r) {
  char line[256];
  if (r["task"] == "ppl") {
    std::snprintf(line, sizeof(line), "| %s | %.4f | %.4f | %lld | %lld | %.1f |\n",
                  variant.c_str(), r["perplexity"].get<double>(), r["mean_nll"].get<double>(),
                  static_cast<long long>(r["num_scored_tokens"].get<int64_t>()),
                  static_cast<long long>(r["num_windows"].get<int64_t>()),
                  r["duration_s"].get<double>());
    return line;
  }
  const std::string exact =
      r["exact_match"].is_null() ? "-" : one_decimal(100 * r["exact_match"].get<double>()) + "%";
  std::snprintf(line, sizeof(line), "| %s | %.4f | %.4f | %s | %lld/%lld | %.0f | %.0f |\n",
                variant.c_str(), r["f1"].get<double>(), r["rouge_l"].get<double>(), exact.c_str(),
                static_cast<long long>(r["completed"].get<int64_t>()),
                static_cast<long long>(r["num_questions"].get<int64_t>()),
                r["mean_prompt_len"].get<double>(), r["mean_latency_ms"].get<double>());
  return line;
}

// Removes a directory of plain files (an SSD tier's); errors are ignored. POSIX calls: libtorch
// ships its own std::filesystem::remove_all, which crashes when it wins symbol resolution.
void remove_flat_directory(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

// Creates `dir` and its missing parents (mkdir -p), so that a long comparison cannot end with
// nowhere to write its results. FAILED_PRECONDITION naming the directory.
Status make_directories(const std::string& dir) {
  for (size_t slash = dir.find('/', 1); ; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return failed_precondition_error("cannot create " + prefix + ": " + std::strerror(errno));
    }
    if (slash == std::string::npos) break;
  }
  struct stat info{};
  if (::stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) ||
      ::access(dir.c_str(), W_OK) != 0) {
    return failed_precondition_error(dir + " is not a writable directory");
  }
  return Status();
}

}  // namespace

Status bench_compare(const Flags& flags, const std::vector<std::string>& args) {
  STRATA_ASSIGN_OR_RETURN(const std::string kind, workload_kind(flags));
  const bool multiturn = kind == "multiturn";
  const bool quality = is_quality(kind);
  const std::vector<std::string>& variant_specs = flags.get_all("variant");
  const std::vector<std::string>& peer_specs = flags.get_all("peer");
  if (variant_specs.empty() && peer_specs.empty()) {
    return invalid_argument_error(
        "give at least one --variant NAME[:key=value,...] or "
        "--peer NAME=URL");
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<double> rates, parse_rates(flags));
  STRATA_ASSIGN_OR_RETURN(bench::LoadOptions load, load_options(flags));
  STRATA_ASSIGN_OR_RETURN(bench::ReportOptions report, report_options(flags));
  STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig base, deployment_from_flags(flags));
  // Every variant's deployment is checked before anything runs.
  std::vector<std::pair<Variant, config::DeploymentConfig>> variants;
  for (const std::string& spec : variant_specs) {
    STRATA_ASSIGN_OR_RETURN(Variant variant, parse_variant(spec));
    config::DeploymentConfig d = base;
    for (const auto& [key, value] : variant.overrides) {
      const Status status = config::apply_override(d, key, value);
      if (!status.ok())
        return invalid_argument_error("--variant " + spec + ": " + status.message());
    }
    STRATA_RETURN_IF_ERROR(d.validate());
    variants.emplace_back(std::move(variant), std::move(d));
  }
  const bool warm_store = flags.has("warm-store");
  if (warm_store) {
    for (const auto& [variant, d] : variants) {
      if (d.kv_store.ssd_dir.empty()) {
        return invalid_argument_error("--warm-store: variant " + variant.name +
                                      " has no kv_store.ssd_dir to share");
      }
    }
  }
  const std::string out_dir = flags.get("output-dir", "bench-compare");
  STRATA_RETURN_IF_ERROR(make_directories(out_dir));  // before any run, not after the last
  // One workload for every run, counted with the model's tokenizer.
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                          load_tokenizer(base.model.path));
  Workload workload;
  QualityWorkload quality_workload;
  if (quality) {
    STRATA_ASSIGN_OR_RETURN(quality_workload, build_quality_workload(flags, kind, *tok));
    rates = {std::numeric_limits<double>::infinity()};  // scores do not depend on the load
  } else {
    STRATA_ASSIGN_OR_RETURN(workload, build_workload(flags, multiturn, *tok));
  }
  STRATA_ASSIGN_OR_RETURN(double temperature, flags.get_double("temperature", 0));
  // Runs the workload on one client.
  auto run = [&](bench::BenchClient& client, double rate, const std::string& backend,
                 const std::string& tokenizer_id) -> StatusOr<Json> {
    if (quality) return run_quality(flags, client, quality_workload, backend);
    bench::LoadOptions run_load = load;
    run_load.request_rate = rate;
    return run_workload(flags, client, workload, run_load, report, backend, tokenizer_id);
  };

  Json runs = Json::array();
  std::string table =
      kind == "ppl"
          ? "| variant | perplexity | mean NLL | scored tokens | windows | duration (s) |\n"
            "|---|---|---|---|---|---|\n"
      : kind == "longqa"
          ? "| variant | token F1 | ROUGE-L | exact match (choice) | answered | "
            "mean prompt tokens | mean latency (ms) |\n|---|---|---|---|---|---|---|\n"
          : "| variant | rate (req/s) | completed | req/s | output tok/s | peak decodes "
            "| TTFT mean (ms) | p50 | p90 | p99 | TPOT mean (ms) | TTFT turns >= 2 (ms) "
            "| gpu hit tokens | dram | ssd | remote |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto record = [&](const std::string& name, Json setup, double rate, const Json& result) {
    table += quality ? quality_row(name, result) : compare_row(name, result);
    setup["variant"] = name;
    setup["request_rate"] = std::isfinite(rate) ? Json(rate) : Json("inf");
    setup["result"] = result;
    runs.push_back(std::move(setup));
  };
  for (const auto& [variant, d] : variants) {
    Json overrides = Json::object();
    for (const auto& [key, value] : variant.overrides) overrides[key] = value;
    for (double rate : rates) {
      // A fresh engine per run: no run inherits another's cached KV, not even the SSD tier's,
      // which survives restarts: each run gets an empty directory inside kv_store.ssd_dir,
      // removed afterwards. With --warm-store every run opens kv_store.ssd_dir itself and
      // leaves it as it is, so later runs load what earlier ones stored.
      std::fprintf(stderr, "[%s @ %g/s] loading %s ...\n", variant.name.c_str(), rate,
                   d.model.path.c_str());
      config::DeploymentConfig run_config = d;
      std::string ssd_dir;
      if (!d.kv_store.ssd_dir.empty() && !warm_store) {
        char suffix[64];
        std::snprintf(suffix, sizeof(suffix), "@%g", rate);
        ssd_dir = d.kv_store.ssd_dir + "/compare-" + variant.name + suffix;
        std::error_code error;
        if (std::filesystem::exists(ssd_dir, error)) {
          return failed_precondition_error(ssd_dir +
                                           " exists (from an interrupted compare?): "
                                           "remove it first");
        }
        run_config.kv_store.ssd_dir = ssd_dir;
      }
      STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(run_config));
      if (multiturn && !loaded.chat_template) return loaded.chat_template_error;
      std::unique_ptr<bench::BenchClient> client = bench::make_engine_client(
          *loaded.engine, loaded.chat_template ? &*loaded.chat_template : nullptr,
          loaded.engine->model_config().name, temperature);
      StatusOr<Json> result = run(*client, rate, "offline", d.model.path);
      client.reset();
      loaded = {};  // the engine and its store are gone: the directory may go
      if (!ssd_dir.empty()) remove_flat_directory(ssd_dir);
      if (!result.ok()) return result.status();
      record(variant.name, {{"kind", "offline"}, {"overrides", overrides}}, rate, *result);
    }
  }
  for (const std::string& spec : peer_specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      return invalid_argument_error("--peer " + spec + ": expected NAME=URL");
    }
    bench::ClientOptions options;
    options.backend = multiturn || kind == "longqa" ? "openai-chat" : "openai";
    options.base_url = spec.substr(eq + 1);
    options.temperature = temperature;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<bench::BenchClient> client,
                            bench::make_remote_client(options, *tok));
    STRATA_RETURN_IF_ERROR(client->probe());
    for (double rate : rates) {
      STRATA_ASSIGN_OR_RETURN(Json result, run(*client, rate, options.backend, base.model.path));
      record(spec.substr(0, eq), {{"kind", "peer"}, {"base_url", options.base_url}}, rate, result);
    }
  }

  std::string command = "strata bench compare";
  for (const std::string& arg : args) {
    command += arg.find_first_of(" ,;:") == std::string::npos ? " " + arg : " '" + arg + "'";
  }
  STRATA_RETURN_IF_ERROR(
      write_file(out_dir + "/compare.json", Json{{"command", command}, {"runs", runs}}.dump(1)));
  STRATA_RETURN_IF_ERROR(
      write_file(out_dir + "/compare.md", "Command: `" + command + "`\n\n" + table));
  std::fputs(table.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/compare.json and %s/compare.md\n", out_dir.c_str(),
               out_dir.c_str());
  if (flags.has("no-plots") || quality) return Status();
  // Plots with matplotlib, in the project's Python environment.
  const std::string python = flags.get("plot-python", STRATA_PLOT_PYTHON);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(python.c_str(), python.c_str(), STRATA_PLOT_SCRIPT, out_dir.c_str(), nullptr);
    std::_Exit(127);
  }
  int wait_status = 0;
  if (pid < 0 || ::waitpid(pid, &wait_status, 0) < 0 || !WIFEXITED(wait_status) ||
      WEXITSTATUS(wait_status) != 0) {
    std::fprintf(stderr,
                 "warning: no plots: %s %s failed (install matplotlib, or pass "
                 "--plot-python PYTHON or --no-plots)\n",
                 python.c_str(), STRATA_PLOT_SCRIPT);
  }
  return Status();
}

}  // namespace strata::cli::bench_runs
