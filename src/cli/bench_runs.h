// What `strata bench`'s modes share (bench_command.cpp defines it, bench_compare.cpp uses it too):
// building a workload from the flags once, and running it on one client.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flags.h"
#include "strata/bench/client.h"
#include "strata/bench/load.h"
#include "strata/bench/quality.h"
#include "strata/bench/report.h"
#include "strata/common/status.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli::bench_runs {

using Json = nlohmann::json;

// The workload: single-turn requests, or each conversation's turns (multiturn).
struct Workload {
  std::vector<bench::BenchRequest> requests;
  std::vector<std::vector<bench::BenchRequest>> conversations;
};

// A quality workload: the text's tokens and windows (ppl), or the questions and their requests
// (longqa); `setup` is recorded in the result.
struct QualityWorkload {
  std::string kind;
  std::vector<TokenId> tokens;
  std::vector<bench::PplWindow> windows;
  std::vector<bench::QaItem> items;
  std::vector<bench::BenchRequest> requests;
  Json setup;
};

// --workload of offline and compare: serve | multiturn | ppl | longqa.
StatusOr<std::string> workload_kind(const Flags& flags);
bool is_quality(const std::string& kind);  // ppl or longqa
// The tokenizer of the model file or HF directory at `path`.
StatusOr<std::unique_ptr<tokenizer::Tokenizer>> load_tokenizer(const std::string& path);
StatusOr<bench::LoadOptions> load_options(const Flags& flags);
StatusOr<bench::ReportOptions> report_options(const Flags& flags);
StatusOr<Workload> build_workload(const Flags& flags, bool multiturn,
                                  const tokenizer::Tokenizer& tok);
StatusOr<QualityWorkload> build_quality_workload(const Flags& flags, const std::string& kind,
                                                 const tokenizer::Tokenizer& tok);
// Runs the workload on `client` with `load`: the result with vLLM's fields and the run's setup.
StatusOr<Json> run_workload(const Flags& flags, bench::BenchClient& client,
                            const Workload& workload, const bench::LoadOptions& load,
                            const bench::ReportOptions& report, const std::string& backend,
                            const std::string& tokenizer_id);
// Runs a quality workload on `client`: ppl windows one after another, longqa questions at
// --max-concurrency.
StatusOr<Json> run_quality(const Flags& flags, bench::BenchClient& client, const QualityWorkload& w,
                           const std::string& backend);
Status write_file(const std::string& path, const std::string& text);

// `strata bench compare` (bench_compare.cpp); `args` are its command-line words.
Status bench_compare(const Flags& flags, const std::vector<std::string>& args);

}  // namespace strata::cli::bench_runs
