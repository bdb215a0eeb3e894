// Long-context quality workloads, for checking that KV compression (and anything else that changes
// attention) keeps what the model says: perplexity on long real text, and long-document question
// answering scored against gold answers (token F1, ROUGE-L, exact match of choice letters).
// Decisions (windows, prompt layout, truncation, normalisation) are in docs/bench.md.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/bench/client.h"
#include "strata/bench/load.h"
#include "strata/bench/workload.h"
#include "strata/common/ids.h"
#include "strata/common/status.h"

namespace strata::tokenizer {
class Tokenizer;
}

namespace strata::bench {

// ---- Perplexity -------------------------------------------------------------------------------

// One scoring request over the token stream: tokens [begin, end) are sent, and the logprobs of
// tokens [score_begin, end) count, each conditioned on every token of the window before it.
struct PplWindow {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t score_begin = 0;
};

// Strided evaluation (as HF's perplexity guide): windows of context_len tokens start every
// `stride` tokens; each scores the tokens no earlier window scored (the first one from its second
// token), so with stride < context_len every token but the first is scored once, with at least
// context_len - stride tokens of context (fewer in the first window); with stride == context_len
// (disjoint windows) each window's first token goes unscored. At most max_windows (0 = all).
// INVALID_ARGUMENT unless 0 < stride <= context_len and num_tokens >= 2.
StatusOr<std::vector<PplWindow>> ppl_windows(int64_t num_tokens, int64_t context_len,
                                             int64_t stride, int64_t max_windows);

// Scores the windows of `token_ids` on `client`, one after another: {"task": "ppl",
// "num_windows", "num_scored_tokens", "mean_nll", "perplexity" (= exp(mean_nll)), "duration_s",
// "windows": [{"begin", "end", "scored_tokens", "nll"}]}. The first failed request ends the run
// with its error.
// decode_tokens > 0: each window's last decode_tokens tokens are scored by decoding them
// (BenchClient::score), and only they count (the result's "decode_tokens").
StatusOr<nlohmann::json> run_perplexity(BenchClient& client, const std::vector<TokenId>& token_ids,
                                        const std::vector<PplWindow>& windows,
                                        int64_t decode_tokens, bool progress);

// ---- Long-document QA -------------------------------------------------------------------------

struct QaItem {
  std::string id;        // "<file name>:<line>[.<question>]"
  std::string context;   // the document
  std::string question;  // with its options for multiple-choice items; empty when the context
                         // already ends with it (BAMBOO altqa)
  std::vector<std::string> answers;  // gold answers: any one counts
  bool multiple_choice = false;      // answers are option letters, scored by exact match
};

struct QaDataset {
  std::vector<QaItem> items;
  int64_t skipped_lines = 0;  // lines that are not JSON (BAMBOO ships a few)
};

// Reads a .jsonl[.xz] file of L-Eval ({"input", "instructions": [...], "outputs": [...],
// "evaluation"}: one item per instruction; "exam" tasks are multiple choice) or BAMBOO
// ({"content", "question", "options", "answer"} multiple choice, or altqa's {"content",
// "answer"}). NOT_FOUND for a missing file; INVALID_ARGUMENT naming the file and line for a
// JSON record in neither layout, or when no item was read.
StatusOr<QaDataset> load_longqa(const std::string& path);

// The items in turns over their documents (consecutive items sharing a context are one
// document's questions): every document's first question, then every second one, and so on, so
// that a document's stored KV waits in the store while the others' questions run (the
// long-document workload of KV stores).
std::vector<QaItem> interleave_documents(std::vector<QaItem> items);

// The chat request for one item: an instruction, the document, the question. The document's
// middle is cut (whole tokens, as LongBench does) to `document_tokens`, by default to what
// leaves the prompt's content at most max_prompt_tokens tokens (longqa_document_budget: the
// document tokens kept once the cut prompt, re-encoded at its seams, fits); max_tokens is the
// answer's budget. A document's questions given the least of their budgets share one cut
// document (a stored document's KV then serves all of them).
int64_t longqa_document_budget(const QaItem& item, const tokenizer::Tokenizer& tokenizer,
                               int64_t max_prompt_tokens);
BenchRequest longqa_request(const QaItem& item, const tokenizer::Tokenizer& tokenizer,
                            int64_t max_prompt_tokens, int64_t max_tokens,
                            std::optional<int64_t> document_tokens = std::nullopt);

// SQuAD's normalisation: lower case, punctuation removed, the articles a / an / the removed,
// whitespace collapsed; the result as words.
std::vector<std::string> normalized_words(std::string_view text);
// Token-level F1 between the normalised words (SQuAD / LongBench qa_f1_score); 0 when either is
// empty.
double token_f1(std::string_view prediction, std::string_view reference);
// ROUGE-L F1: longest common subsequence of the normalised words.
double rouge_l(std::string_view prediction, std::string_view reference);
// The option letters an answer states: the first word made only of the letters A-E ("B",
// "(C)", "Answer: AD" -> "AD"), sorted; empty when there is none.
std::string choice_letters(std::string_view text);

struct QaScore {
  double f1 = 0;
  double rouge_l = 0;
  double exact_match = 0;  // multiple choice: the stated letters equal the gold ones
};
// The best score over the item's gold answers.
QaScore score_answer(const QaItem& item, std::string_view prediction);

// The answers of run_requests() over longqa_request()s of `items`, scored: {"task": "longqa",
// "num_questions", "completed", "failed", "f1", "rouge_l" (means over completed answers),
// "num_multiple_choice", "exact_match" (mean over those; null without any), "mean_prompt_len",
// "mean_latency_ms", "mean_ttft_ms", "mean_tpot_ms" (over answers of 2 tokens or more; null
// without any), "duration_s", "tier_hit_tokens" and "store_counters" (the run's, null when the
// client has none), "errors" (one per question, "" when answered, as vLLM's), "items": [{"id",
// "prompt_len", "prediction", "answers", "ttft_ms", "output_len", "tpot_ms" (answers of 2 tokens
// or more), "cached_prompt_tokens" (null when unknown), "f1", "rouge_l", "exact_match"}]}.
nlohmann::json longqa_metrics(const std::vector<QaItem>& items, const LoadRun& run);

}  // namespace strata::bench
