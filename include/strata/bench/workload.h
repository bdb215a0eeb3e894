// Benchmark workloads: the requests `strata bench` sends, built from a ShareGPT-format file or a
// synthetic generator, with lengths counted by the benchmark's own tokenizer.
//
// ShareGPT format (vLLM's and SGLang's loaders read the same files): a JSON list of
//   {"id": str, "conversations": [{"from": "human"|"gpt"|"system", "value": str}, ...]}
// read from FILE.json or an xz-compressed FILE.json.xz.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/common/status.h"

namespace strata::tokenizer {
class Tokenizer;
}

namespace strata::bench {

struct Message {
  std::string role;  // system | user | assistant
  std::string content;
};

// One request of a workload. Completion backends send `prompt`; chat backends send `messages`
// (a single user message with `prompt` when empty).
struct BenchRequest {
  std::string prompt;
  std::vector<Message> messages;
  int64_t prompt_len = 0;  // tokens of the prompt (the chat messages' contents, untemplated)
  int64_t max_tokens = 0;  // output tokens asked for
  // Strata's kv_task extension (the AdaptCache task family of its stored KV); empty: not sent.
  std::string kv_task;
};

// A conversation of the data set: an optional system message, then alternating user and
// assistant messages that start with a user message.
struct Conversation {
  std::string id;
  std::vector<Message> messages;
  int64_t num_user_turns() const;
};

// The contents of a data file, xz-decompressed when its name ends with .xz. NOT_FOUND for a
// missing file, INVALID_ARGUMENT naming it for a corrupt .xz.
StatusOr<std::string> read_data_file(const std::string& path);

// Reads a ShareGPT file. Records are normalised to Conversation: leading assistant messages (a
// segment continuing an earlier one) are dropped, consecutive messages of one role are merged,
// records without a user message are skipped. INVALID_ARGUMENT naming the file and the record for
// malformed JSON or a record that is not in the format above; NOT_FOUND for a missing file.
StatusOr<std::vector<Conversation>> load_sharegpt(const std::string& path);

struct SharegptSampling {
  int64_t num_prompts = 1000;
  uint64_t seed = 0;
  // Output tokens per request: 0 uses the length of the data set's reply.
  int64_t output_len = 0;
  // vLLM's filter: prompt and reply of at least 4 tokens, prompt <= 1024, prompt + reply <= 2048.
  int64_t max_prompt_len = 1024;
  int64_t max_total_len = 2048;
};

// Single-turn requests as `vllm bench serve --dataset-name sharegpt` makes them: the first user
// message of each conversation (shuffled with `seed`) is the prompt and the first reply's token
// count is max_tokens; pairs outside the length filter are skipped. INVALID_ARGUMENT when fewer
// than num_prompts pairs pass the filter.
StatusOr<std::vector<BenchRequest>> sample_sharegpt(const std::vector<Conversation>& conversations,
                                                    const tokenizer::Tokenizer& tokenizer,
                                                    const SharegptSampling& sampling);

struct RandomSampling {
  int64_t num_prompts = 1000;
  uint64_t seed = 0;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  // Lengths are drawn uniformly from [len * (1 - range_ratio), len * (1 + range_ratio)].
  double range_ratio = 0;
  int64_t prefix_len = 0;  // random tokens shared by every prompt, before its own
};

// Prompts of random non-special tokens (decoded to text, which any OpenAI server accepts);
// prompt_len is the token count of that text re-encoded.
StatusOr<std::vector<BenchRequest>> random_requests(const tokenizer::Tokenizer& tokenizer,
                                                    const RandomSampling& sampling);

struct TextSampling {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
};

// Prompts of real text for long-context serving (random tokens attend unlike language, which
// matters to KV compression): the text tokenized whole and cut into consecutive windows of
// input_len tokens, decoded back to text (prompt_len is that text re-encoded). INVALID_ARGUMENT
// when the text has fewer than num_prompts windows.
StatusOr<std::vector<BenchRequest>> text_requests(const tokenizer::Tokenizer& tokenizer,
                                                  const std::string& text,
                                                  const TextSampling& sampling);

// The turns of one conversation as chat requests: turn i sends the system message, the data
// set's first i user messages and the data set's replies between them (the history follows the
// real conversation, whatever the server answered), asking for as many tokens as the data set's
// reply i has (at most max_output_len when > 0; max_output_len for a user message without a reply;
// at least 1). At most max_turns turns when > 0.
std::vector<BenchRequest> conversation_turns(const Conversation& conversation,
                                             const tokenizer::Tokenizer& tokenizer,
                                             int64_t max_turns, int64_t max_output_len);

}  // namespace strata::bench
