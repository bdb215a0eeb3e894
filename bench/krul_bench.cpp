// Krul on real conversations (docs/krul.md): per conversation, the attention statistics of its
// history, the I-R layers, Krul's pairs against MiniCache's, the resumed turn's perplexity with
// each (include/strata/bench/krul_quality.h), and the statistics' cost; then the aggregate: the
// mean edge share per layer, how often each layer is I-R and each pair is chosen (the paper's
// Fig. 20), perplexity ratios to the full KV, and the estimator's time against the passes.
//
// A conversation of the ShareGPT file with m >= 4 messages is rendered with the model's chat
// template; its history is every message before the last user message (rounded down to whole
// blocks), the continuation the rest (at most --max-eval tokens). Conversations whose history is
// outside [--min-history, --max-history] tokens are skipped.
//
//   build/bench/krul_bench --model MODEL.gguf --sharegpt FILE.json[.xz] [--conversations 20]
//       [--min-history 256] [--max-history 1536] [--max-eval 256] [--gamma 0.5] [--share 0.5]
//       [--slerp-t 0.6] [--retain 0.05] [--decode-steps 16] [--row-stride 1]
// Prints one JSON object.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_model.h"
#include "strata/bench/krul_quality.h"
#include "strata/executor/executor.h"

namespace {

using Json = nlohmann::json;
namespace bench = strata::bench;
namespace executor = strata::executor;
using strata::TokenId;

struct Options {
  std::string model;
  std::string sharegpt;
  int64_t conversations = 20;
  int64_t min_history = 256;
  int64_t max_history = 1536;
  int64_t max_eval = 256;
  bench::KrulQualityOptions krul;
};

int fail(const strata::Status& status) {
  std::cerr << status.to_string() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // stdout carries the JSON result
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model")
      o.model = value;
    else if (flag == "--sharegpt")
      o.sharegpt = value;
    else if (flag == "--conversations")
      o.conversations = std::stoll(value);
    else if (flag == "--min-history")
      o.min_history = std::stoll(value);
    else if (flag == "--max-history")
      o.max_history = std::stoll(value);
    else if (flag == "--max-eval")
      o.max_eval = std::stoll(value);
    else if (flag == "--gamma")
      o.krul.gamma = std::stod(value);
    else if (flag == "--share")
      o.krul.share = std::stod(value);
    else if (flag == "--slerp-t")
      o.krul.slerp_t = std::stod(value);
    else if (flag == "--retain")
      o.krul.retain = std::stod(value);
    else if (flag == "--decode-steps")
      o.krul.decode_steps = static_cast<int32_t>(std::stoll(value));
    else if (flag == "--row-stride")
      o.krul.row_stride = static_cast<int32_t>(std::stoll(value));
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (o.model.empty() || o.sharegpt.empty()) {
    std::cerr << "usage: krul_bench --model MODEL.gguf --sharegpt FILE.json[.xz] [flags]\n";
    return 2;
  }
  auto model = bench::open_chat_model(o.model, "krul_bench");
  if (!model.ok()) return fail(model.status());
  executor::ExecutorOptions options;
  options.cache_bytes = int64_t{2} << 30;
  auto exec = executor::Executor::create(*model->source, options);
  if (!exec.ok()) return fail(exec.status());
  auto conversations = bench::load_sharegpt(o.sharegpt);
  if (!conversations.ok()) return fail(conversations.status());
  const int64_t block = (*exec)->kv_geometry().block_size_tokens;
  const int32_t layers = static_cast<int32_t>((*exec)->config().num_layers);

  Json runs = Json::array();
  std::vector<double> edge_sum(static_cast<size_t>(layers), 0.0);
  std::vector<int64_t> ir_count(static_cast<size_t>(layers), 0);
  std::map<std::string, int64_t> pair_count;
  std::map<std::string, double> log_ratio_sum;  // of each variant's perplexity to full's
  double prefill = 0, prefill_observed = 0, reduce = 0, step = 0, step_observed = 0;
  double sampled_prefill = 0, sampled_reduce = 0, sampled_step = 0, ir_agree = 0, pairs_agree = 0;
  for (const bench::Conversation& c : *conversations) {
    if (std::ssize(runs) >= o.conversations) break;
    const auto& messages = c.messages;
    if (messages.size() < 4 || messages.back().role != "assistant") continue;
    const std::vector<bench::Message> earlier(messages.begin(), messages.end() - 2);
    auto history = model->render(earlier, false);
    auto full = model->render(messages, false);
    if (!history.ok() || !full.ok()) continue;
    const int64_t h = std::ssize(*history) / block * block;
    if (h < o.min_history || h > o.max_history || std::ssize(*full) < h + 2 ||
        !std::equal(history->begin(), history->begin() + h, full->begin())) {
      continue;
    }
    const int64_t e = std::min<int64_t>(o.max_eval, std::ssize(*full) - h);
    auto r = bench::measure_krul_quality(
        **exec, std::span(*full).first(static_cast<size_t>(h)),
        std::span(*full).subspan(static_cast<size_t>(h), static_cast<size_t>(e)), o.krul);
    if (!r.ok()) return fail(r.status());
    Json variants = Json::object();
    for (const bench::KrulVariant& v : r->variants) {
      Json pairs = Json::array();
      for (const auto& p : v.pairs) pairs.push_back({p.shallow, p.deep});
      variants[v.name] = {
          {"perplexity", v.perplexity}, {"pairs", pairs}, {"retained_share", v.retained_share}};
      log_ratio_sum[v.name] += std::log(v.perplexity / r->variants.front().perplexity);
      if (v.name == "krul") {
        for (const auto& p : v.pairs)
          ++pair_count[std::to_string(p.shallow) + "-" + std::to_string(p.deep)];
      }
    }
    for (int32_t l = 0; l < layers; ++l) {
      edge_sum[static_cast<size_t>(l)] += r->edge_share[static_cast<size_t>(l)];
      ir_count[static_cast<size_t>(l)] += r->initial_recent[static_cast<size_t>(l)] ? 1 : 0;
    }
    prefill += r->prefill_seconds;
    prefill_observed += r->prefill_observed_seconds;
    reduce += r->reduce_seconds;
    step += r->decode_step_seconds;
    step_observed += r->decode_step_observed_seconds;
    sampled_prefill += r->sampled_prefill_observed_seconds;
    sampled_reduce += r->sampled_reduce_seconds;
    sampled_step += r->sampled_decode_step_seconds;
    ir_agree += r->sampled_initial_recent_agreement;
    pairs_agree += r->sampled_pairs_agreement;
    runs.push_back(Json{{"id", c.id},
                        {"history_tokens", r->history_tokens},
                        {"scored_tokens", r->scored_tokens},
                        {"edge_share", r->edge_share},
                        {"variants", variants},
                        {"prefill_seconds", r->prefill_seconds},
                        {"prefill_observed_seconds", r->prefill_observed_seconds},
                        {"reduce_seconds", r->reduce_seconds},
                        {"decode_step_seconds", r->decode_step_seconds},
                        {"decode_step_observed_seconds", r->decode_step_observed_seconds},
                        {"sampled_prefill_observed_seconds", r->sampled_prefill_observed_seconds},
                        {"sampled_reduce_seconds", r->sampled_reduce_seconds},
                        {"sampled_decode_step_seconds", r->sampled_decode_step_seconds},
                        {"sampled_initial_recent_agreement", r->sampled_initial_recent_agreement},
                        {"sampled_pairs_agreement", r->sampled_pairs_agreement}});
    std::fprintf(stderr, "%zu/%lld %s: history %lld, ppl full %.3f krul %.3f minicache %.3f\n",
                 runs.size(), static_cast<long long>(o.conversations), c.id.c_str(),
                 static_cast<long long>(h), r->variants[0].perplexity, r->variants[1].perplexity,
                 r->variants[2].perplexity);
  }
  const double n = static_cast<double>(runs.size());
  if (runs.empty()) return fail(strata::not_found_error("no conversation fits the length filters"));
  Json mean_edge = Json::array(), ir_share = Json::array(), ratios = Json::object();
  for (int32_t l = 0; l < layers; ++l) {
    mean_edge.push_back(edge_sum[static_cast<size_t>(l)] / n);
    ir_share.push_back(static_cast<double>(ir_count[static_cast<size_t>(l)]) / n);
  }
  for (const auto& [name, sum] : log_ratio_sum) ratios[name] = std::exp(sum / n);
  Json summary = {{"conversations", runs.size()},
                  {"gamma", o.krul.gamma},
                  {"share", o.krul.share},
                  {"slerp_t", o.krul.slerp_t},
                  {"retain", o.krul.retain},
                  {"mean_edge_share", mean_edge},
                  {"initial_recent_share", ir_share},
                  {"krul_pair_counts", pair_count},
                  {"perplexity_ratio_to_full_geomean", ratios},
                  {"prefill_observed_over_plain", prefill_observed / prefill},
                  {"prompt_reduction_over_prefill", reduce / prefill},
                  {"decode_step_observed_over_plain", step_observed / step}};
  if (o.krul.row_stride > 1) {
    summary["row_stride"] = o.krul.row_stride;
    summary["sampled_prefill_observed_over_plain"] = sampled_prefill / prefill;
    summary["sampled_prompt_reduction_over_prefill"] = sampled_reduce / prefill;
    summary["sampled_decode_step_over_plain"] = sampled_step / step;
    summary["sampled_initial_recent_agreement"] = ir_agree / n;
    summary["sampled_pairs_agreement"] = pairs_agree / n;
  }
  std::cout << Json({{"summary", summary}, {"runs", runs}}).dump(1) << "\n";
  return 0;
}
