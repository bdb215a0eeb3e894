// CachedAttention's truncation experiment (its Table 1) on a real model and real text: perplexity
// of a continuation after a history whose oldest part was dropped, with the kept KV recomputed
// (TT), loaded re-rotated to compacted positions (CA, what Strata's store does) or loaded without
// re-rotation (NKVT). See include/strata/bench/truncation.h.
//
// Windows are consecutive, disjoint stretches of history + eval tokens of the tokenized file (no
// BOS); the pooled perplexity of each method is exp(sum NLL / sum scored tokens) over windows.
//
//   build/bench/truncation_bench --model MODEL.gguf
//       --text ../shared/data/ppl/wikitext-2-raw-v1_test.raw [--windows 4] [--skip-tokens 0]
//       [--history 1024] [--drop 512] [--eval 1536] [--drop-first-block] [--dtype float32]
//       [--kv-cache-bytes 2147483648]
// Prints one JSON object.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/bench/truncation.h"
#include "strata/bench/workload.h"
#include "strata/executor/executor.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace {

using Json = nlohmann::json;
namespace bench = strata::bench;
namespace executor = strata::executor;

struct Options {
  std::string model;
  std::string text;
  int64_t windows = 4;
  int64_t skip_tokens = 0;
  bench::TruncationOptions truncation;
  std::string dtype = "float32";
  int64_t kv_cache_bytes = int64_t{2} << 30;
};

int fail(const strata::Status& status) {
  std::cerr << status.to_string() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // stdout carries the JSON result
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--drop-first-block") {
      o.truncation.keep_first_block = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::cerr << flag << " needs a value\n";
      return 2;
    }
    const std::string value = argv[++i];
    if (flag == "--model") {
      o.model = value;
    } else if (flag == "--text") {
      o.text = value;
    } else if (flag == "--windows") {
      o.windows = std::stoll(value);
    } else if (flag == "--skip-tokens") {
      o.skip_tokens = std::stoll(value);
    } else if (flag == "--history") {
      o.truncation.history_tokens = std::stoll(value);
    } else if (flag == "--drop") {
      o.truncation.drop_tokens = std::stoll(value);
    } else if (flag == "--eval") {
      o.truncation.eval_tokens = std::stoll(value);
    } else if (flag == "--dtype") {
      o.dtype = value;
    } else if (flag == "--kv-cache-bytes") {
      o.kv_cache_bytes = std::stoll(value);
    } else {
      std::cerr << "unknown flag " << flag << " (see the header of bench/truncation_bench.cpp)\n";
      return 2;
    }
  }
  if (o.model.empty() || o.text.empty()) {
    std::cerr << "--model FILE and --text FILE are required\n";
    return 2;
  }
  auto source = strata::model::open_model_source(o.model);
  if (!source.ok()) return fail(source.status());
  auto tokenizer =
      (*source)->gguf() != nullptr
          ? strata::tokenizer::Tokenizer::from_gguf(*(*source)->gguf())
          : strata::tokenizer::Tokenizer::from_tokenizer_json((*source)->tokenizer_json_path());
  if (!tokenizer.ok()) return fail(tokenizer.status());
  auto dtype = executor::parse_dtype(o.dtype);
  if (!dtype.ok()) return fail(dtype.status());
  executor::ExecutorOptions options;
  options.dtype = *dtype;
  options.cache_bytes = o.kv_cache_bytes;
  auto exec = executor::Executor::create(**source, options);
  if (!exec.ok()) return fail(exec.status());
  auto text = bench::read_data_file(o.text);
  if (!text.ok()) return fail(text.status());
  const std::vector<strata::TokenId> tokens = (*tokenizer)->encode(*text, false);

  const bench::TruncationOptions& t = o.truncation;
  const int64_t span = t.history_tokens + t.eval_tokens;
  Json out = {{"bench", "truncation"},
              {"model", o.model},
              {"text", o.text},
              {"dtype", o.dtype},
              {"history_tokens", t.history_tokens},
              {"drop_tokens", t.drop_tokens},
              {"eval_tokens", t.eval_tokens},
              {"keep_first_block", t.keep_first_block},
              {"windows", Json::array()}};
  double tt = 0, ca = 0, nkvt = 0;
  int64_t scored = 0;
  for (int64_t w = 0; w < o.windows; ++w) {
    const int64_t first = o.skip_tokens + w * span;
    if (first + span > static_cast<int64_t>(tokens.size())) break;
    auto r = bench::measure_truncation(
        **exec, std::span<const strata::TokenId>(tokens).subspan(first, span), t);
    if (!r.ok()) return fail(r.status());
    std::fprintf(stderr, "window %lld (tokens %lld..): TT %.4f  CA %.4f  NKVT %.2f\n",
                 static_cast<long long>(w), static_cast<long long>(first), r->tt.perplexity,
                 r->ca.perplexity, r->nkvt.perplexity);
    out["windows"].push_back({{"first_token", first},
                              {"scored_tokens", r->scored_tokens},
                              {"tt", r->tt.perplexity},
                              {"ca", r->ca.perplexity},
                              {"nkvt", r->nkvt.perplexity}});
    tt += r->tt.nll;
    ca += r->ca.nll;
    nkvt += r->nkvt.nll;
    scored += r->scored_tokens;
  }
  if (scored == 0) {
    std::cerr << "the text has " << tokens.size() << " tokens: not one window of " << span << "\n";
    return 1;
  }
  auto ppl = [&](double nll) { return std::exp(nll / static_cast<double>(scored)); };
  out["scored_tokens"] = scored;
  out["tt"] = ppl(tt);
  out["ca"] = ppl(ca);
  out["nkvt"] = ppl(nkvt);
  out["ca_minus_tt"] = ppl(ca) - ppl(tt);
  out["ca_minus_tt_relative"] = (ppl(ca) - ppl(tt)) / ppl(tt);
  std::cout << out.dump(2) << "\n";
  return 0;
}
