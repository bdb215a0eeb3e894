#include "strata/bench/workload.h"

#include <gtest/gtest.h>
#include <lzma.h>

#include <fstream>
#include <set>

#include "default_tokenizer_test.h"
#include "support/temp_dir.h"

namespace strata::bench {
namespace {

using test_util::TempDir;

class WorkloadTest : public DefaultTokenizerTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_.path() / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  int64_t tokens(const std::string& text) const {
    return static_cast<int64_t>(tokenizer_->encode(text, false).size());
  }

  TempDir dir_;
};

constexpr const char* kConversations = R"([
  {"id": "continues", "conversations": [
    {"from": "gpt", "value": "the end of an earlier segment"},
    {"from": "human", "value": "What is the capital of France? Answer briefly please."},
    {"from": "gpt", "value": "Paris is the capital of France, on the Seine."},
    {"from": "human", "value": "And of Italy?"},
    {"from": "human", "value": "Of Spain too."},
    {"from": "gpt", "value": "Rome, and Madrid for Spain."}]},
  {"id": "system", "conversations": [
    {"from": "system", "value": "Be terse."},
    {"from": "human", "value": "Name three prime numbers, in increasing order."},
    {"from": "gpt", "value": "Two, three and five are the first three primes."}]},
  {"id": "no-user", "conversations": [{"from": "gpt", "value": "only an answer"}]}
])";

TEST_F(WorkloadTest, ShareGptRecordsAreNormalisedToConversations) {
  auto conversations = load_sharegpt(write("c.json", kConversations));
  ASSERT_TRUE(conversations.ok()) << conversations.status().to_string();
  ASSERT_EQ(conversations->size(), 2u) << "the record without a user message is skipped";
  const Conversation& first = (*conversations)[0];
  EXPECT_EQ(first.id, "continues");
  ASSERT_EQ(first.messages.size(), 4u) << "leading reply dropped, consecutive user messages merged";
  EXPECT_EQ(first.messages[0].role, "user");
  EXPECT_EQ(first.messages[2].content, "And of Italy?\nOf Spain too.");
  EXPECT_EQ(first.num_user_turns(), 2);
  const Conversation& second = (*conversations)[1];
  EXPECT_EQ(second.messages[0].role, "system");
  EXPECT_EQ(second.messages[0].content, "Be terse.");
}

TEST_F(WorkloadTest, XzCompressedFilesReadTheSame) {
  const std::string json = kConversations;
  std::string compressed(json.size() + 1024, '\0');
  size_t size = 0;
  ASSERT_EQ(lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, nullptr,
                                    reinterpret_cast<const uint8_t*>(json.data()), json.size(),
                                    reinterpret_cast<uint8_t*>(compressed.data()), &size,
                                    compressed.size()),
            LZMA_OK);
  compressed.resize(size);
  auto plain = load_sharegpt(write("c.json", json));
  auto xz = load_sharegpt(write("c.json.xz", compressed));
  ASSERT_TRUE(xz.ok()) << xz.status().to_string();
  ASSERT_EQ(xz->size(), plain->size());
  EXPECT_EQ((*xz)[0].messages[1].content, (*plain)[0].messages[1].content);
  auto truncated = load_sharegpt(write("t.json.xz", compressed.substr(0, size / 2)));
  EXPECT_EQ(truncated.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find("t.json.xz"), std::string::npos);
}

TEST_F(WorkloadTest, MalformedFilesNameTheFileAndRecord) {
  struct Case {
    const char* bytes;
    const char* says;
  };
  for (const Case& c : {Case{"[{\"id\": 1", "not valid JSON"},
                        Case{"{\"id\": \"x\"}", "JSON list"},
                        Case{"[{\"conversations\": []}, 5]", "record 1"},
                        Case{"[{\"conversations\": [{\"from\": \"human\"}]}]", "record 0"},
                        Case{"[{\"conversations\": [{\"from\": \"robot\", \"value\": \"x\"}]}]",
                             "robot"},
                        Case{"[]", "no conversation"}}) {
    auto result = load_sharegpt(write("bad.json", c.bytes));
    ASSERT_FALSE(result.ok()) << c.bytes;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << c.bytes;
    EXPECT_NE(result.status().message().find("bad.json"), std::string::npos) << c.bytes;
    EXPECT_NE(result.status().message().find(c.says), std::string::npos)
        << result.status().message();
  }
  EXPECT_EQ(load_sharegpt((dir_.path() / "missing.json").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(WorkloadTest, ShareGptSamplingTakesFirstExchangesWithTheirReplyLengths) {
  auto conversations = load_sharegpt(write("c.json", kConversations));
  ASSERT_TRUE(conversations.ok());
  SharegptSampling sampling;
  sampling.num_prompts = 2;
  auto requests = sample_sharegpt(*conversations, *tokenizer_, sampling);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  std::set<std::string> prompts;
  for (const BenchRequest& r : *requests) {
    prompts.insert(r.prompt);
    EXPECT_EQ(r.prompt_len, tokens(r.prompt));
    EXPECT_TRUE(r.messages.empty());
  }
  EXPECT_EQ(prompts, (std::set<std::string>{
                         "What is the capital of France? Answer briefly please.",
                         "Name three prime numbers, in increasing order."}));
  for (const BenchRequest& r : *requests) {
    const std::string reply = r.prompt.starts_with("What")
                                  ? "Paris is the capital of France, on the Seine."
                                  : "Two, three and five are the first three primes.";
    EXPECT_EQ(r.max_tokens, tokens(reply));
  }
  sampling.output_len = 9;
  auto fixed = sample_sharegpt(*conversations, *tokenizer_, sampling);
  ASSERT_TRUE(fixed.ok());
  for (const BenchRequest& r : *fixed) EXPECT_EQ(r.max_tokens, 9);
  sampling.num_prompts = 3;
  auto too_many = sample_sharegpt(*conversations, *tokenizer_, sampling);
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("only 2"), std::string::npos);
  sampling.num_prompts = 2;
  sampling.max_prompt_len = 5;  // both prompts are longer
  EXPECT_FALSE(sample_sharegpt(*conversations, *tokenizer_, sampling).ok());
}

TEST_F(WorkloadTest, RandomPromptsAreSeededOrdinaryTokensOfTheAskedLengths) {
  RandomSampling sampling;
  sampling.num_prompts = 20;
  sampling.input_len = 64;
  sampling.output_len = 16;
  sampling.range_ratio = 0.25;
  sampling.prefix_len = 8;
  sampling.seed = 7;
  auto requests = random_requests(*tokenizer_, sampling);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 20u);
  std::set<int64_t> output_lens;
  for (const BenchRequest& r : *requests) {
    EXPECT_EQ(r.prompt_len, tokens(r.prompt));
    // Decoding random tokens and encoding again merges or splits a few of them.
    EXPECT_GE(r.prompt_len, (8 + 48) / 2);
    EXPECT_LE(r.prompt_len, (8 + 80) * 2);
    EXPECT_GE(r.max_tokens, 12);
    EXPECT_LE(r.max_tokens, 20);
    output_lens.insert(r.max_tokens);
    for (tokenizer::TokenId id : tokenizer_->encode(r.prompt, false)) {
      EXPECT_FALSE(tokenizer_->is_special(id)) << "special token " << id << " in a random prompt";
    }
  }
  EXPECT_GT(output_lens.size(), 1u) << "lengths vary with range_ratio";
  // The shared prefix: every prompt starts with the same text.
  const std::string head = (*requests)[0].prompt.substr(0, 8);
  for (const BenchRequest& r : *requests) EXPECT_EQ(r.prompt.substr(0, 8), head);
  auto again = random_requests(*tokenizer_, sampling);
  EXPECT_EQ((*again)[5].prompt, (*requests)[5].prompt) << "seeded";
  sampling.seed = 8;
  EXPECT_NE((*random_requests(*tokenizer_, sampling))[5].prompt, (*requests)[5].prompt);
  sampling.range_ratio = 1.0;
  EXPECT_EQ(random_requests(*tokenizer_, sampling).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(WorkloadTest, TextPromptsAreConsecutiveWindowsOfTheText) {
  std::string text;
  for (int i = 0; i < 60; ++i) text += "Sentence number " + std::to_string(i) + " of the text. ";
  const std::vector<tokenizer::TokenId> ids = tokenizer_->encode(text, false);
  TextSampling sampling;
  sampling.num_prompts = 3;
  sampling.input_len = 50;
  sampling.output_len = 9;
  auto requests = text_requests(*tokenizer_, text, sampling);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const BenchRequest& r = (*requests)[i];
    EXPECT_EQ(r.prompt,
              tokenizer_->decode({ids.begin() + 50 * i, ids.begin() + 50 * (i + 1)}, false));
    EXPECT_EQ(r.prompt_len, tokens(r.prompt));
    EXPECT_NEAR(static_cast<double>(r.prompt_len), 50, 2) << "re-encoding a cut window";
    EXPECT_EQ(r.max_tokens, 9);
  }
  EXPECT_NE((*requests)[0].prompt, (*requests)[1].prompt);
  sampling.num_prompts = static_cast<int64_t>(ids.size()) / 50 + 1;
  const Status short_text = text_requests(*tokenizer_, text, sampling).status();
  EXPECT_EQ(short_text.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_text.message().find("prompts of 50"), std::string::npos) << short_text.message();
}

TEST_F(WorkloadTest, ConversationTurnsFollowTheDataSetHistory) {
  auto conversations = load_sharegpt(write("c.json", kConversations));
  ASSERT_TRUE(conversations.ok());
  const Conversation& c = (*conversations)[0];
  const std::vector<BenchRequest> turns = conversation_turns(c, *tokenizer_, 0, 0);
  ASSERT_EQ(turns.size(), 2u);
  ASSERT_EQ(turns[0].messages.size(), 1u);
  ASSERT_EQ(turns[1].messages.size(), 3u);
  EXPECT_EQ(turns[1].messages[1].content, "Paris is the capital of France, on the Seine.")
      << "the history carries the data set's reply";
  EXPECT_EQ(turns[0].max_tokens, tokens("Paris is the capital of France, on the Seine."));
  EXPECT_EQ(turns[1].max_tokens, tokens("Rome, and Madrid for Spain."));
  EXPECT_EQ(turns[1].prompt_len, tokens(c.messages[0].content) + tokens(c.messages[1].content) +
                                     tokens(c.messages[2].content));
  EXPECT_EQ(conversation_turns(c, *tokenizer_, 1, 0).size(), 1u);
  for (const BenchRequest& turn : conversation_turns(c, *tokenizer_, 0, 3)) {
    EXPECT_EQ(turn.max_tokens, 3);
  }
}

}  // namespace
}  // namespace strata::bench
