#include "strata/bench/quality.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "default_tokenizer_test.h"
#include "support/temp_dir.h"

namespace strata::bench {
namespace {

using test_util::TempDir;

// ---- Perplexity windows -----------------------------------------------------------------------

TEST(PplWindowsTest, StridedWindowsScoreEveryTokenButTheFirstOnce) {
  StatusOr<std::vector<PplWindow>> w = ppl_windows(10, 4, 2, 0);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(w->size(), 4u);
  const std::vector<std::array<int64_t, 3>> expected = {
      {0, 4, 1}, {2, 6, 4}, {4, 8, 6}, {6, 10, 8}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ((*w)[i].begin, expected[i][0]) << i;
    EXPECT_EQ((*w)[i].end, expected[i][1]) << i;
    EXPECT_EQ((*w)[i].score_begin, expected[i][2]) << i;
  }
  for (const auto& [n, context, stride] : std::vector<std::array<int64_t, 3>>{
           {2, 2, 1}, {100, 16, 16}, {100, 16, 5}, {97, 32, 7}, {5, 64, 32}, {1000, 100, 1}}) {
    w = ppl_windows(n, context, stride, 0);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    std::vector<int> scored(n, 0);
    for (const PplWindow& window : *w) {
      EXPECT_LE(window.end - window.begin, context);
      EXPECT_LT(window.begin, window.score_begin);  // a scored token has context in the window
      for (int64_t t = window.score_begin; t < window.end; ++t) ++scored[t];
    }
    EXPECT_EQ(scored[0], 0);
    for (int64_t t = 1; t < n; ++t) {
      // Disjoint windows leave each window's first token unscored.
      const int expected = stride == context && t % stride == 0 ? 0 : 1;
      EXPECT_EQ(scored[t], expected) << n << "/" << context << "/" << stride << " token " << t;
    }
  }
}

TEST(PplWindowsTest, CapAndInvalidArguments) {
  StatusOr<std::vector<PplWindow>> w = ppl_windows(1000, 100, 50, 3);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->size(), 3u);
  EXPECT_EQ(ppl_windows(10, 4, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ppl_windows(10, 4, 5, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ppl_windows(1, 4, 2, 0).status().code(), StatusCode::kInvalidArgument);
}

// ---- Scores -----------------------------------------------------------------------------------

TEST(QaScoreTest, NormalisationFollowsSquad) {
  EXPECT_EQ(normalized_words("The Answer: don't  stop, A-Team!\n"),
            (std::vector<std::string>{"answer", "dont", "stop", "ateam"}));
  EXPECT_EQ(normalized_words("an apple a day"), (std::vector<std::string>{"apple", "day"}));
  EXPECT_TRUE(normalized_words(" ... ").empty());
}

TEST(QaScoreTest, TokenF1AndRougeLOnKnownPairs) {
  // pred {cat, sat, on, mat}, gold {cat, on, mat}: P = 3/4, R = 1.
  EXPECT_NEAR(token_f1("the cat sat on the mat", "a cat on a mat"), 6.0 / 7.0, 1e-12);
  EXPECT_NEAR(rouge_l("the cat sat on the mat", "a cat on a mat"), 6.0 / 7.0, 1e-12);
  // ROUGE-L sees word order, F1 does not (Lin 2004's example).
  EXPECT_NEAR(token_f1("the gunman kill police", "police kill the gunman"), 1.0, 1e-12);
  EXPECT_NEAR(rouge_l("the gunman kill police", "police kill the gunman"), 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(rouge_l("police killed the gunman", "police kill the gunman"), 2.0 / 3.0, 1e-12);
  // Repeated words count as often as the gold has them.
  EXPECT_NEAR(token_f1("yes yes yes", "yes"), 0.5, 1e-12);
  EXPECT_EQ(token_f1("", "anything"), 0);
  EXPECT_EQ(rouge_l("anything", "the"), 0);
  EXPECT_EQ(token_f1("1964", "1964"), 1);
}

TEST(QaScoreTest, ChoiceLetters) {
  EXPECT_EQ(choice_letters("B"), "B");
  EXPECT_EQ(choice_letters("(C) because the text says so"), "C");
  EXPECT_EQ(choice_letters("Answer: DA"), "AD");
  EXPECT_EQ(choice_letters("I think it is B."), "B");
  EXPECT_EQ(choice_letters("Based on nothing"), "");
  EXPECT_EQ(choice_letters(""), "");
}

TEST(QaScoreTest, BestOverGoldAnswersAndExactMatchOnlyForChoices) {
  QaItem open;
  open.answers = {"Paris is the capital", "Paris"};
  QaScore s = score_answer(open, "Paris");
  EXPECT_EQ(s.f1, 1);
  EXPECT_EQ(s.exact_match, 0);
  QaItem choice;
  choice.multiple_choice = true;
  choice.answers = {"(B) the second"};
  EXPECT_EQ(score_answer(choice, "B. the second").exact_match, 1);
  EXPECT_EQ(score_answer(choice, "C").exact_match, 0);
  EXPECT_EQ(score_answer(choice, "no idea").exact_match, 0);
}

// ---- Data sets and prompts --------------------------------------------------------------------

class LongQaTest : public DefaultTokenizerTest {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_.path() / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  TempDir dir_;
};

TEST_F(LongQaTest, ReadsLEvalAndBambooAndSkipsLinesThatAreNotJson) {
  using Json = nlohmann::json;
  const std::string leval_exam = Json{
      {"input", "doc one"},
      {"instructions", {"Why? (A) x (B) y", "How? (A) p (B) q"}},
      {"outputs", {"(B) y", "(A) p"}},
      {"evaluation", "exam"}}.dump();
  const std::string leval_open = Json{
      {"input", "doc two"},
      {"instructions", {"Summarise."}},
      {"outputs", {"A summary."}},
      {"evaluation", "rouge"}}.dump();
  StatusOr<QaDataset> leval =
      load_longqa(write("leval.jsonl", leval_exam + "\n" + leval_open + "\n"));
  ASSERT_TRUE(leval.ok()) << leval.status().to_string();
  ASSERT_EQ(leval->items.size(), 3u);
  EXPECT_EQ(leval->items[0].id, "leval.jsonl:1.0");
  EXPECT_EQ(leval->items[1].question, "How? (A) p (B) q");
  EXPECT_EQ(leval->items[1].answers, std::vector<std::string>{"(A) p"});
  EXPECT_TRUE(leval->items[0].multiple_choice);
  EXPECT_FALSE(leval->items[2].multiple_choice) << "\"A summary.\" is no option letter";
  EXPECT_EQ(leval->items[2].context, "doc two");

  const std::string meeting = Json{
      {"content", "minutes"},
      {"question", "Who?"},
      {"options", {"A. Ann", "B. Bob"}},
      {"answer", "B"}}.dump();
  const std::string altqa =
      Json{{"content", "Document: x\n\nQuestion:\nwhen?\n"}, {"answer", "1964"}}.dump();
  StatusOr<QaDataset> bamboo =
      load_longqa(write("bamboo.jsonl", meeting + "\n{\"content\": \"cut off\n" + altqa + "\n\n"));
  ASSERT_TRUE(bamboo.ok()) << bamboo.status().to_string();
  EXPECT_EQ(bamboo->skipped_lines, 1);
  ASSERT_EQ(bamboo->items.size(), 2u);
  EXPECT_EQ(bamboo->items[0].question, "Who?\nA. Ann\nB. Bob");
  EXPECT_TRUE(bamboo->items[0].multiple_choice);
  EXPECT_EQ(bamboo->items[1].id, "bamboo.jsonl:3");
  EXPECT_TRUE(bamboo->items[1].question.empty());
  EXPECT_FALSE(bamboo->items[1].multiple_choice);
}

TEST(InterleaveDocumentsTest, QuestionsComeInTurnsOverTheDocuments) {
  auto item = [](const std::string& context, const std::string& question) {
    QaItem i;
    i.context = context;
    i.question = question;
    return i;
  };
  const std::vector<QaItem> interleaved = interleave_documents(
      {item("a", "a1"), item("a", "a2"), item("a", "a3"), item("b", "b1"), item("c", "c1"),
       item("c", "c2")});
  std::vector<std::string> order;
  for (const QaItem& i : interleaved) order.push_back(i.question);
  EXPECT_EQ(order, (std::vector<std::string>{"a1", "b1", "c1", "a2", "c2", "a3"}));
  EXPECT_TRUE(interleave_documents({}).empty());
}

TEST_F(LongQaTest, BadFilesAreClearErrors) {
  EXPECT_EQ(load_longqa((dir_.path() / "missing.jsonl").string()).status().code(),
            StatusCode::kNotFound);
  StatusOr<QaDataset> other = load_longqa(write("other.jsonl",
                                                "{\"content\": \"x\", \"answer\": \"y\"}\n"
                                                "{\"text\": \"neither\"}\n"));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("other.jsonl: line 2"), std::string::npos)
      << other.status().message();
  StatusOr<QaDataset> mismatched = load_longqa(
      write("mismatch.jsonl", R"({"input": "d", "instructions": ["q1", "q2"], "outputs": ["a"]})"));
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("2 instructions but 1 outputs"), std::string::npos);
  StatusOr<QaDataset> garbage = load_longqa(write("garbage.jsonl", "not json\n"));
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("no question-answer record"), std::string::npos);
}

TEST_F(LongQaTest, LongDocumentsLoseTheirMiddleToFitTheBudget) {
  QaItem item;
  for (int i = 0; i < 3000; ++i) item.context += "word" + std::to_string(i) + " ";
  item.question = "Which word comes first?";
  const BenchRequest request = longqa_request(item, *tokenizer_, 300, 16);
  EXPECT_LE(request.prompt_len, 300);
  EXPECT_GE(request.prompt_len, 290) << "the budget is used";
  EXPECT_EQ(request.prompt_len,
            static_cast<int64_t>(tokenizer_->encode(request.prompt, false).size()));
  EXPECT_NE(request.prompt.find("word0 word1 "), std::string::npos) << "the head stays";
  EXPECT_NE(request.prompt.find("word2999"), std::string::npos) << "the tail stays";
  EXPECT_EQ(request.prompt.find("word1500 "), std::string::npos) << "the middle goes";
  EXPECT_NE(request.prompt.find("Question: Which word comes first?\nAnswer:"), std::string::npos);
  ASSERT_EQ(request.messages.size(), 1u);
  EXPECT_EQ(request.messages[0].content, request.prompt);
  EXPECT_EQ(request.max_tokens, 16);

  QaItem short_item;
  short_item.context = "A short document.";
  short_item.question = "Is it short?";
  const BenchRequest whole = longqa_request(short_item, *tokenizer_, 300, 8);
  EXPECT_NE(whole.prompt.find("Document:\nA short document.\n\nQuestion: Is it short?"),
            std::string::npos)
      << whole.prompt;
}

TEST_F(LongQaTest, QuestionsGivenOneDocumentBudgetShareTheCutDocument) {
  QaItem short_question, long_question;
  for (int i = 0; i < 3000; ++i) short_question.context += "word" + std::to_string(i) + " ";
  long_question.context = short_question.context;
  short_question.question = "First?";
  long_question.question = "Which of the words that this long document lists comes first of all?";
  const int64_t budget = std::min(longqa_document_budget(short_question, *tokenizer_, 300),
                                  longqa_document_budget(long_question, *tokenizer_, 300));
  EXPECT_LT(longqa_document_budget(long_question, *tokenizer_, 300),
            longqa_document_budget(short_question, *tokenizer_, 300));
  const BenchRequest a = longqa_request(short_question, *tokenizer_, 300, 16, budget);
  const BenchRequest b = longqa_request(long_question, *tokenizer_, 300, 16, budget);
  const size_t end = a.prompt.find("\n\nQuestion:");
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(a.prompt.substr(0, end), b.prompt.substr(0, end)) << "one cut document";
  EXPECT_LE(b.prompt_len, 300);
  // Each cut to its own budget, their documents differ.
  EXPECT_NE(longqa_request(short_question, *tokenizer_, 300, 16).prompt.substr(0, end),
            b.prompt.substr(0, end));
}

// Real text re-encodes at the cut's seam into other tokens: the budget is what fits once it has,
// so the questions of an L-Eval QuALITY document share its whole cut document, not just the head
// (a budget that ignored the seam let the longest question cut again, and its tail differed).
TEST_F(LongQaTest, QuestionsOfARealDocumentShareItsWholeCutDocument) {
  StatusOr<QaDataset> data = load_longqa(
      STRATA_SOURCE_DIR "/../shared/data/longctx/leval/Closed-ended-tasks/quality.jsonl.xz");
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  int64_t documents = 0;
  for (size_t i = 0; i + 2 < data->items.size() && documents < 3; ++i) {
    const std::vector<QaItem> questions(data->items.begin() + i, data->items.begin() + i + 3);
    if (questions[0].context != questions[2].context ||
        (i > 0 && data->items[i - 1].context == questions[0].context)) {
      continue;
    }
    ++documents;
    int64_t budget = INT64_MAX;
    for (const QaItem& q : questions) {
      budget = std::min(budget, longqa_document_budget(q, *tokenizer_, 2048));
    }
    std::vector<std::string> documents_seen;
    for (const QaItem& q : questions) {
      const BenchRequest r = longqa_request(q, *tokenizer_, 2048, 16, budget);
      EXPECT_LE(r.prompt_len, 2048);
      documents_seen.push_back(r.prompt.substr(0, r.prompt.find("\n\nQuestion:")));
    }
    EXPECT_EQ(documents_seen[0], documents_seen[1]) << questions[0].id;
    EXPECT_EQ(documents_seen[0], documents_seen[2]) << questions[0].id;
  }
  EXPECT_EQ(documents, 3);
}

}  // namespace
}  // namespace strata::bench
