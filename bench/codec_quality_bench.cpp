// AdaptCache's quality profile per task family (docs/adaptcache.md, decision 11): every store
// codec on sampled entries of one family (include/strata/bench/codec_quality.h), one entry at a
// time on the executor, against the uncompressed model's answers. Families:
//   chat           ShareGPT conversations of >= 4 messages: the history is every message before
//                  the last user message (rendered with the chat template, whole blocks), the
//                  prompt the rest up to the assistant's turn (--min-history/--max-history);
//   long-document  L-Eval / BAMBOO documents of >= 2 questions: the history is the part of the
//                  first question's request (longqa_request, cut to --max-input-len) that the
//                  document's second question shares (what a stored document serves), the prompt
//                  the rest.
//
//   build/bench/codec_quality_bench --model MODEL.gguf --family chat|long-document --data FILE
//       [--entries 20] [--answer-tokens 64] [--min-history 256] [--max-history 1536]
//       [--max-input-len 2048]
// Prints one JSON object: per entry and codec the stored share, dropped tokens, agreement, KL and
// the answer's token F1 against the reference answer; per codec the means.
// bench/task_quality_profile.py writes the means into a profile's task_quality.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_model.h"
#include "strata/bench/codec_quality.h"
#include "strata/bench/quality.h"
#include "strata/executor/executor.h"

namespace {

using Json = nlohmann::json;
namespace bench = strata::bench;
namespace executor = strata::executor;
namespace tokenizer = strata::tokenizer;
using strata::TokenId;

struct Options {
  std::string model, family, data;
  int64_t entries = 20;
  int64_t min_history = 256;
  int64_t max_history = 1536;
  int64_t max_input_len = 2048;
  bench::CodecQualityOptions quality;
};

struct Entry {
  std::string id;
  std::vector<TokenId> history, prompt;
};

int fail(const strata::Status& status) {
  std::cerr << status.to_string() << "\n";
  return 1;
}

// Tokens two prompts share from their start.
int64_t shared_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  return std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin();
}

// The entry of `full` whose first `shared` tokens a stored item serves (whole blocks).
std::optional<Entry> entry_of(std::string id, const std::vector<TokenId>& full, int64_t shared,
                              int64_t block) {
  const int64_t h = std::min<int64_t>(shared, std::ssize(full) - 1) / block * block;
  if (h < 2 * block) return std::nullopt;
  return Entry{std::move(id), {full.begin(), full.begin() + h}, {full.begin() + h, full.end()}};
}

strata::StatusOr<std::vector<Entry>> chat_entries(const Options& o, const bench::ChatModel& model,
                                                  int64_t block) {
  STRATA_ASSIGN_OR_RETURN(std::vector<bench::Conversation> conversations,
                          bench::load_sharegpt(o.data));
  std::vector<Entry> entries;
  for (const bench::Conversation& c : conversations) {
    if (std::ssize(entries) >= o.entries) break;
    const auto& messages = c.messages;
    if (messages.size() < 4 || messages.back().role != "assistant" ||
        messages[messages.size() - 2].role != "user") {
      continue;
    }
    auto history = model.render({messages.begin(), messages.end() - 2}, false);
    auto full = model.render({messages.begin(), messages.end() - 1}, true);
    if (!history.ok() || !full.ok()) continue;
    std::optional<Entry> e = entry_of(c.id, *full, shared_prefix(*history, *full), block);
    if (!e || std::ssize(e->history) < o.min_history || std::ssize(e->history) > o.max_history) {
      continue;
    }
    entries.push_back(std::move(*e));
  }
  return entries;
}

strata::StatusOr<std::vector<Entry>> document_entries(const Options& o,
                                                      const bench::ChatModel& model,
                                                      int64_t block) {
  const tokenizer::Tokenizer& tok = *model.tokenizer;
  STRATA_ASSIGN_OR_RETURN(bench::QaDataset data, bench::load_longqa(o.data));
  std::vector<Entry> entries;
  const auto& items = data.items;
  for (size_t i = 0; i + 1 < items.size() && std::ssize(entries) < o.entries; ++i) {
    if (items[i].context != items[i + 1].context ||
        (i > 0 && items[i - 1].context == items[i].context)) {
      continue;  // a document's first two questions
    }
    const int64_t budget =
        std::min(bench::longqa_document_budget(items[i], tok, o.max_input_len),
                 bench::longqa_document_budget(items[i + 1], tok, o.max_input_len));
    std::vector<std::vector<TokenId>> full;
    for (size_t k = i; k < i + 2; ++k) {
      const bench::BenchRequest r =
          bench::longqa_request(items[k], tok, o.max_input_len, o.quality.answer_tokens, budget);
      STRATA_ASSIGN_OR_RETURN(std::vector<TokenId> ids, model.render(r.messages, true));
      full.push_back(std::move(ids));
    }
    if (std::optional<Entry> e =
            entry_of(items[i].id, full[0], shared_prefix(full[0], full[1]), block)) {
      entries.push_back(std::move(*e));
    }
  }
  return entries;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // stdout carries the JSON result
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model")
      o.model = value;
    else if (flag == "--family")
      o.family = value;
    else if (flag == "--data")
      o.data = value;
    else if (flag == "--entries")
      o.entries = std::stoll(value);
    else if (flag == "--answer-tokens")
      o.quality.answer_tokens = std::stoll(value);
    else if (flag == "--min-history")
      o.min_history = std::stoll(value);
    else if (flag == "--max-history")
      o.max_history = std::stoll(value);
    else if (flag == "--max-input-len")
      o.max_input_len = std::stoll(value);
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (o.model.empty() || o.data.empty() || (o.family != "chat" && o.family != "long-document")) {
    std::cerr << "usage: codec_quality_bench --model MODEL.gguf --family chat|long-document "
                 "--data FILE [flags]\n";
    return 2;
  }
  auto model = bench::open_chat_model(o.model, "codec_quality_bench");
  if (!model.ok()) return fail(model.status());
  o.quality.eos = model->tokenizer->eos_id();
  executor::ExecutorOptions options;
  options.cache_bytes = int64_t{1} << 30;
  // Entries are a few thousand tokens; the pool must hold one full context, which a 32K-token
  // model's would not in 1 GiB.
  options.max_context_tokens = 8192;
  auto exec = executor::Executor::create(*model->source, options);
  if (!exec.ok()) return fail(exec.status());
  const int64_t block = (*exec)->kv_geometry().block_size_tokens;
  auto entries =
      o.family == "chat" ? chat_entries(o, *model, block) : document_entries(o, *model, block);
  if (!entries.ok()) return fail(entries.status());
  if (entries->empty()) return fail(strata::not_found_error("no entry fits the length filters"));

  auto text = [&](const std::vector<TokenId>& ids) {
    return model->tokenizer->decode(ids, /*skip_special=*/true);
  };
  Json runs = Json::array();
  std::map<std::string, std::map<std::string, double>> sums;  // codec -> metric -> sum
  for (const Entry& e : *entries) {
    auto r = bench::measure_codec_quality(**exec, e.history, e.prompt, o.quality);
    if (!r.ok()) return fail(r.status());
    const std::string reference = text(r->codecs[0].answer);
    Json codecs = Json::object();
    for (const bench::CodecQuality& q : r->codecs) {
      const std::string answer = text(q.answer);
      const double f1 = answer == reference ? 1.0 : bench::token_f1(answer, reference);
      codecs[q.codec] = {{"stored_share", q.stored_share},
                         {"dropped_tokens", q.dropped_tokens},
                         {"agreement", q.agreement},
                         {"kl", q.kl},
                         {"f1", f1},
                         {"answer", answer}};
      auto& s = sums[q.codec];
      s["stored_share"] += q.stored_share;
      s["agreement"] += q.agreement;
      s["kl"] += q.kl;
      s["f1"] += f1;
    }
    runs.push_back({{"id", e.id},
                    {"history_tokens", r->history_tokens},
                    {"prompt_tokens", r->prompt_tokens},
                    {"answer_tokens", r->codecs[0].answer.size()},
                    {"codecs", codecs}});
    std::fprintf(stderr, "%zu/%zu %s: history %lld, agreement kivi-2 %.3f streaming-0.25 %.3f\n",
                 runs.size(), entries->size(), e.id.c_str(),
                 static_cast<long long>(r->history_tokens),
                 codecs["kivi-2"]["agreement"].get<double>(),
                 codecs["streaming-0.25"]["agreement"].get<double>());
  }
  const double n = static_cast<double>(runs.size());
  Json means = Json::object();
  for (const auto& [codec, s] : sums) {
    for (const auto& [metric, sum] : s) means[codec][metric] = sum / n;
  }
  std::cout << Json{{"family", o.family},
                    {"data", o.data},
                    {"model", o.model},
                    {"entries", runs.size()},
                    {"answer_tokens", o.quality.answer_tokens},
                    {"means", means},
                    {"runs", runs}}
                   .dump(2)
            << "\n";
  return 0;
}
