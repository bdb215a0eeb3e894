#include "strata/bench/quality.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "progress.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::bench {

namespace {

using Json = nlohmann::json;

// Whether a gold answer names options: "(B) ...", "B", "AD".
bool names_options(std::string_view answer) {
  size_t i = answer.find_first_not_of(" \t\n");
  if (i == std::string_view::npos) return false;
  const bool parenthesised = answer[i] == '(';
  if (parenthesised) ++i;
  const size_t start = i;
  while (i < answer.size() && answer[i] >= 'A' && answer[i] <= 'E') ++i;
  if (i == start) return false;
  if (parenthesised) return i < answer.size() && answer[i] == ')';
  return i == answer.size() || !std::isalnum(static_cast<unsigned char>(answer[i]));
}

std::string file_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

StatusOr<std::vector<std::string>> string_list(const Json& value) {
  if (!value.is_array()) return invalid_argument_error("is not a list");
  std::vector<std::string> out;
  for (const Json& v : value) {
    if (!v.is_string()) return invalid_argument_error("has an entry that is not a string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

// Appends the items of one JSON record (L-Eval or BAMBOO layout).
Status parse_record(const Json& record, const std::string& id, QaDataset& out) {
  if (!record.is_object()) return invalid_argument_error("is not a JSON object");
  if (record.contains("instructions")) {  // L-Eval
    if (!record.contains("input") || !record["input"].is_string() || !record.contains("outputs")) {
      return invalid_argument_error("L-Eval record needs \"input\" and \"outputs\"");
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<std::string> questions,
                            string_list(record["instructions"]));
    STRATA_ASSIGN_OR_RETURN(std::vector<std::string> answers, string_list(record["outputs"]));
    if (questions.size() != answers.size()) {
      return invalid_argument_error("has " + std::to_string(questions.size()) +
                                    " instructions but " + std::to_string(answers.size()) +
                                    " outputs");
    }
    const bool exam = record.value("evaluation", "") == "exam";
    for (size_t q = 0; q < questions.size(); ++q) {
      QaItem item;
      item.id = id + "." + std::to_string(q);
      item.context = record["input"].get<std::string>();
      item.question = questions[q];
      item.multiple_choice = exam && names_options(answers[q]);
      item.answers = {answers[q]};
      out.items.push_back(std::move(item));
    }
    return Status();
  }
  if (record.contains("content") && record["content"].is_string() && record.contains("answer") &&
      record["answer"].is_string()) {  // BAMBOO
    QaItem item;
    item.id = id;
    item.context = record["content"].get<std::string>();
    item.answers = {record["answer"].get<std::string>()};
    if (record.contains("question")) {
      if (!record["question"].is_string())
        return invalid_argument_error("\"question\" is not a string");
      item.question = record["question"].get<std::string>();
      if (record.contains("options")) {
        STRATA_ASSIGN_OR_RETURN(std::vector<std::string> options, string_list(record["options"]));
        for (const std::string& option : options) item.question += "\n" + option;
        item.multiple_choice = names_options(item.answers[0]);
      }
    }
    out.items.push_back(std::move(item));
    return Status();
  }
  return invalid_argument_error(
      "is neither L-Eval ({\"input\", \"instructions\", \"outputs\"}) nor BAMBOO ({\"content\", "
      "\"answer\"[, \"question\", \"options\"]})");
}

// Longest common subsequence length of two word lists.
size_t lcs_length(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<size_t> row(b.size() + 1, 0);
  for (const std::string& x : a) {
    size_t diagonal = 0;  // row[j - 1] of the previous row
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = x == b[j - 1] ? diagonal + 1 : std::max(row[j], row[j - 1]);
      diagonal = up;
    }
  }
  return row[b.size()];
}

double f_measure(double overlap, size_t predicted, size_t reference) {
  if (overlap == 0 || predicted == 0 || reference == 0) return 0;
  const double precision = overlap / static_cast<double>(predicted);
  const double recall = overlap / static_cast<double>(reference);
  return 2 * precision * recall / (precision + recall);
}

}  // namespace

StatusOr<std::vector<PplWindow>> ppl_windows(int64_t num_tokens, int64_t context_len,
                                             int64_t stride, int64_t max_windows) {
  if (!(stride > 0 && stride <= context_len)) {
    return invalid_argument_error("the stride must be in [1, context length " +
                                  std::to_string(context_len) + "], got " + std::to_string(stride));
  }
  if (num_tokens < 2) return invalid_argument_error("the text has fewer than 2 tokens");
  std::vector<PplWindow> windows;
  int64_t scored_until = 1;  // the first token is never scored
  for (int64_t begin = 0; scored_until < num_tokens; begin += stride) {
    if (max_windows > 0 && static_cast<int64_t>(windows.size()) == max_windows) break;
    const int64_t end = std::min(begin + context_len, num_tokens);
    // A window's first token has nothing before it in the window: with stride == context_len it
    // goes unscored.
    windows.push_back({begin, end, std::max(scored_until, begin + 1)});
    scored_until = end;
  }
  return windows;
}

StatusOr<Json> run_perplexity(BenchClient& client, const std::vector<TokenId>& token_ids,
                              const std::vector<PplWindow>& windows, int64_t decode_tokens,
                              bool progress) {
  const auto start = std::chrono::steady_clock::now();
  Progress bar("scoring", static_cast<int64_t>(windows.size()), progress);
  Json rows = Json::array();
  double total_nll = 0;
  int64_t total_scored = 0;
  for (const PplWindow& w : windows) {
    const std::vector<TokenId> ids(token_ids.begin() + w.begin, token_ids.begin() + w.end);
    StatusOr<std::vector<double>> logprobs =
        client.score(ids, std::min<int64_t>(decode_tokens, std::ssize(ids) - 1));
    if (!logprobs.ok()) {
      return Status(logprobs.status().code(), "window [" + std::to_string(w.begin) + ", " +
                                                  std::to_string(w.end) +
                                                  "): " + logprobs.status().message());
    }
    if (static_cast<int64_t>(logprobs->size()) != w.end - w.begin - 1) {
      return internal_error("window [" + std::to_string(w.begin) + ", " + std::to_string(w.end) +
                            "): " + std::to_string(logprobs->size()) + " logprobs for " +
                            std::to_string(w.end - w.begin) + " tokens");
    }
    double nll = 0;
    // Decoded tokens only, when some are: what the prompt's full-precision forward scores is the
    // same with and without a KV compression of the decode phase.
    const int64_t first = decode_tokens > 0 ? std::max(w.score_begin, w.end - decode_tokens)
                                            : w.score_begin;
    // (*logprobs)[i] scores token begin + 1 + i.
    for (int64_t t = first; t < w.end; ++t) nll -= (*logprobs)[t - w.begin - 1];
    rows.push_back(
        {{"begin", w.begin}, {"end", w.end}, {"scored_tokens", w.end - first}, {"nll", nll}});
    total_nll += nll;
    total_scored += w.end - first;
    bar.advance();
  }
  const double mean_nll = total_scored > 0 ? total_nll / static_cast<double>(total_scored) : 0;
  return Json{{"task", "ppl"},
              {"num_windows", windows.size()},
              {"decode_tokens", decode_tokens},
              {"num_scored_tokens", total_scored},
              {"mean_nll", mean_nll},
              {"perplexity", std::exp(mean_nll)},
              {"duration_s",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
              {"windows", std::move(rows)}};
}

std::vector<QaItem> interleave_documents(std::vector<QaItem> items) {
  std::vector<std::vector<QaItem>> documents;
  for (QaItem& item : items) {
    if (documents.empty() || documents.back().front().context != item.context) documents.emplace_back();
    documents.back().push_back(std::move(item));
  }
  std::vector<QaItem> out;
  for (size_t turn = 0; out.size() < items.size(); ++turn) {
    for (std::vector<QaItem>& questions : documents) {
      if (turn < questions.size()) out.push_back(std::move(questions[turn]));
    }
  }
  return out;
}

StatusOr<QaDataset> load_longqa(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_data_file(path));
  QaDataset out;
  std::istringstream lines(text);
  std::string line;
  const std::string name = file_name(path);
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const Json record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) {
      ++out.skipped_lines;
      continue;
    }
    const Status status = parse_record(record, name + ":" + std::to_string(number), out);
    if (!status.ok()) {
      return invalid_argument_error(path + ": line " + std::to_string(number) + " " +
                                    status.message());
    }
  }
  if (out.items.empty()) return invalid_argument_error(path + ": no question-answer record");
  return out;
}

namespace {

std::string longqa_prompt(const QaItem& item, const std::string& document) {
  if (item.question.empty()) return document + "\nAnswer:";  // the context asks the question
  const char* instruction =
      item.multiple_choice
          ? "Read the document and answer the multiple-choice question after it with the "
            "letter of the correct option only."
          : "Read the document and answer the question after it concisely.";
  return std::string(instruction) + "\n\nDocument:\n" + document + "\n\nQuestion: " +
         item.question + "\nAnswer:";
}

// The item's prompt with the document cut to at most `keep` of its tokens, and fewer until the
// prompt has at most max_prompt_tokens tokens (text re-encoded at the seams may take a token or
// two more); the prompt, its token count and the document tokens kept.
struct CutPrompt {
  std::string prompt;
  int64_t tokens = 0;
  int64_t keep = 0;
};
CutPrompt cut_prompt(const QaItem& item, const tokenizer::Tokenizer& tokenizer,
                     int64_t max_prompt_tokens, std::optional<int64_t> keep_at_most) {
  // Encodes the (possibly very long) document once; only prompts near the budget are encoded
  // whole.
  const std::vector<TokenId> doc = tokenizer.encode(item.context, false);
  const std::span<const TokenId> all(doc);
  const auto num_doc = static_cast<int64_t>(doc.size());
  CutPrompt cut;
  if (keep_at_most) {
    cut.keep = std::min(num_doc, *keep_at_most);
  } else {
    const auto overhead =
        static_cast<int64_t>(tokenizer.encode(longqa_prompt(item, ""), false).size());
    cut.keep = std::min(num_doc, std::max<int64_t>(0, max_prompt_tokens - overhead));
  }
  while (true) {
    // Keep the document's head and tail, whole tokens, as LongBench cuts long inputs.
    cut.prompt =
        cut.keep == num_doc
            ? longqa_prompt(item, item.context)
            : longqa_prompt(item, tokenizer.decode(all.first(cut.keep / 2), false) +
                                      tokenizer.decode(all.last(cut.keep - cut.keep / 2), false));
    cut.tokens = static_cast<int64_t>(tokenizer.encode(cut.prompt, false).size());
    const int64_t excess = cut.tokens - max_prompt_tokens;
    if (excess <= 0 || cut.keep == 0) return cut;
    cut.keep = std::max<int64_t>(0, cut.keep - excess);
  }
}

}  // namespace

int64_t longqa_document_budget(const QaItem& item, const tokenizer::Tokenizer& tokenizer,
                               int64_t max_prompt_tokens) {
  return cut_prompt(item, tokenizer, max_prompt_tokens, std::nullopt).keep;
}

BenchRequest longqa_request(const QaItem& item, const tokenizer::Tokenizer& tokenizer,
                            int64_t max_prompt_tokens, int64_t max_tokens,
                            std::optional<int64_t> document_tokens) {
  CutPrompt cut = cut_prompt(item, tokenizer, max_prompt_tokens, document_tokens);
  BenchRequest request;
  request.prompt = std::move(cut.prompt);
  request.prompt_len = cut.tokens;
  request.messages = {{"user", request.prompt}};
  request.max_tokens = max_tokens;
  return request;
}

std::vector<std::string> normalized_words(std::string_view text) {
  std::vector<std::string> words;
  std::string word;
  const auto flush = [&] {
    if (!word.empty() && word != "a" && word != "an" && word != "the") words.push_back(word);
    word.clear();
  };
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isspace(u)) {
      flush();
    } else if (u < 0x80 && std::ispunct(u)) {
      continue;  // removed, not a separator ("don't" -> "dont", as SQuAD)
    } else {
      word.push_back(static_cast<char>(std::tolower(u)));
    }
  }
  flush();
  return words;
}

double token_f1(std::string_view prediction, std::string_view reference) {
  const std::vector<std::string> predicted = normalized_words(prediction);
  const std::vector<std::string> gold = normalized_words(reference);
  std::map<std::string, int64_t> counts;
  for (const std::string& w : gold) ++counts[w];
  double common = 0;
  for (const std::string& w : predicted) {
    auto it = counts.find(w);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++common;
    }
  }
  return f_measure(common, predicted.size(), gold.size());
}

double rouge_l(std::string_view prediction, std::string_view reference) {
  const std::vector<std::string> predicted = normalized_words(prediction);
  const std::vector<std::string> gold = normalized_words(reference);
  return f_measure(static_cast<double>(lcs_length(predicted, gold)), predicted.size(), gold.size());
}

std::string choice_letters(std::string_view text) {
  std::string word;
  const auto is_choice = [](const std::string& w) {
    return !w.empty() && w.size() <= 5 &&
           std::all_of(w.begin(), w.end(), [](char c) { return c >= 'A' && c <= 'E'; });
  };
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ' ';
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word.push_back(c);
      continue;
    }
    if (is_choice(word)) {
      std::sort(word.begin(), word.end());
      return word;
    }
    word.clear();
  }
  return {};
}

QaScore score_answer(const QaItem& item, std::string_view prediction) {
  QaScore best;
  for (const std::string& answer : item.answers) {
    best.f1 = std::max(best.f1, token_f1(prediction, answer));
    best.rouge_l = std::max(best.rouge_l, rouge_l(prediction, answer));
    if (item.multiple_choice) {
      const std::string stated = choice_letters(prediction);
      if (!stated.empty() && stated == choice_letters(answer)) best.exact_match = 1;
    }
  }
  return best;
}

Json longqa_metrics(const std::vector<QaItem>& items, const LoadRun& run) {
  Json rows = Json::array();
  Json errors = Json::array();
  double f1 = 0, rouge = 0, exact = 0, prompt_len = 0, latency = 0, ttft = 0, tpot = 0;
  int64_t completed = 0, multiple_choice = 0, completed_choice = 0, decoded = 0;
  for (size_t i = 0; i < items.size() && i < run.results.size(); ++i) {
    const QaItem& item = items[i];
    const RequestResult& r = run.results[i];
    Json row = {
        {"id", item.id},
        {"prompt_len", r.prompt_len},
        {"prediction", r.generated_text},
        {"answers", item.answers},
        {"ttft_ms", r.ttft_s * 1e3},
        {"output_len", r.output_len},
        {"cached_prompt_tokens", r.cached_prompt_tokens ? Json(*r.cached_prompt_tokens) : Json()}};
    errors.push_back(r.error);
    multiple_choice += item.multiple_choice ? 1 : 0;
    if (r.success) {
      const QaScore score = score_answer(item, r.generated_text);
      row["f1"] = score.f1;
      row["rouge_l"] = score.rouge_l;
      row["exact_match"] = item.multiple_choice ? Json(score.exact_match) : Json();
      f1 += score.f1;
      rouge += score.rouge_l;
      exact += score.exact_match;
      prompt_len += static_cast<double>(r.prompt_len);
      latency += r.latency_s;
      ttft += r.ttft_s;
      if (r.output_len > 1) {  // time per output token after the first, as `bench serve`
        const double t = (r.latency_s - r.ttft_s) / static_cast<double>(r.output_len - 1);
        row["tpot_ms"] = t * 1e3;
        tpot += t;
        ++decoded;
      }
      ++completed;
      completed_choice += item.multiple_choice ? 1 : 0;
    }
    rows.push_back(std::move(row));
  }
  const double n = std::max<double>(1, static_cast<double>(completed));
  return Json{
      {"task", "longqa"},
      {"num_questions", items.size()},
      {"completed", completed},
      {"failed", static_cast<int64_t>(items.size()) - completed},
      {"f1", f1 / n},
      {"rouge_l", rouge / n},
      {"num_multiple_choice", multiple_choice},
      {"exact_match",
       completed_choice > 0 ? Json(exact / static_cast<double>(completed_choice)) : Json()},
      {"mean_prompt_len", prompt_len / n},
      {"mean_latency_ms", latency / n * 1e3},
      {"mean_ttft_ms", ttft / n * 1e3},
      {"mean_tpot_ms", decoded > 0 ? Json(tpot / static_cast<double>(decoded) * 1e3) : Json()},
      {"duration_s", run.duration_s},
      {"tier_hit_tokens", run.tier_hit_tokens ? Json(*run.tier_hit_tokens) : Json()},
      {"store_counters", run.store_counters ? Json(*run.store_counters) : Json()},
      {"errors", std::move(errors)},
      {"items", std::move(rows)}};
}

}  // namespace strata::bench
