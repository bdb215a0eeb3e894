#include "strata/bench/workload.h"

#include <lzma.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "strata/tokenizer/tokenizer.h"

namespace strata::bench {

namespace {

using Json = nlohmann::json;
using tokenizer::TokenId;

StatusOr<std::string> read_raw_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, path + ": cannot open the data file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return internal_error(path + ": read failed");
  return bytes;
}

StatusOr<std::string> xz_decompress(const std::string& path, const std::string& compressed) {
  lzma_stream stream = LZMA_STREAM_INIT;
  if (lzma_stream_decoder(&stream, UINT64_MAX, 0) != LZMA_OK) {
    return internal_error(path + ": cannot start the xz decoder");
  }
  std::string out;
  std::vector<uint8_t> buffer(1 << 20);
  stream.next_in = reinterpret_cast<const uint8_t*>(compressed.data());
  stream.avail_in = compressed.size();
  lzma_ret ret = LZMA_OK;
  while (ret == LZMA_OK) {
    stream.next_out = buffer.data();
    stream.avail_out = buffer.size();
    ret = lzma_code(&stream, LZMA_FINISH);
    out.append(reinterpret_cast<const char*>(buffer.data()), buffer.size() - stream.avail_out);
  }
  lzma_end(&stream);
  if (ret != LZMA_STREAM_END) {
    return invalid_argument_error(path + ": not a valid xz file (liblzma error " +
                                  std::to_string(static_cast<int>(ret)) + ")");
  }
  return out;
}

StatusOr<std::string> role_of(const std::string& from) {
  if (from == "human" || from == "user") return std::string("user");
  if (from == "gpt" || from == "assistant" || from == "chatgpt" || from == "bing" ||
      from == "bard") {
    return std::string("assistant");
  }
  if (from == "system") return std::string("system");
  return invalid_argument_error("unknown speaker \"" + from + "\"");
}

// One record -> Conversation; an empty one when it has no user message.
StatusOr<Conversation> parse_record(const Json& record) {
  if (!record.is_object()) return invalid_argument_error("is not an object");
  Conversation conversation;
  if (auto id = record.find("id"); id != record.end() && id->is_string()) conversation.id = *id;
  auto turns = record.find("conversations");
  if (turns == record.end() || !turns->is_array()) {
    return invalid_argument_error("has no \"conversations\" list");
  }
  std::string system;
  for (const Json& turn : *turns) {
    if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
        !turn.contains("value") || !turn["value"].is_string()) {
      return invalid_argument_error("has a turn without string \"from\" and \"value\"");
    }
    STRATA_ASSIGN_OR_RETURN(std::string role, role_of(turn["from"].get<std::string>()));
    std::string text = turn["value"].get<std::string>();
    if (role == "system") {
      system += text;
      continue;
    }
    std::vector<Message>& messages = conversation.messages;
    if (messages.empty() && role == "assistant") continue;  // continues an earlier segment
    if (!messages.empty() && messages.back().role == role) {
      messages.back().content += "\n" + text;
    } else {
      messages.push_back({role, std::move(text)});
    }
  }
  if (!conversation.messages.empty() && !system.empty()) {
    conversation.messages.insert(conversation.messages.begin(), {"system", system});
  }
  return conversation;
}

}  // namespace

int64_t Conversation::num_user_turns() const {
  return std::count_if(messages.begin(), messages.end(),
                       [](const Message& m) { return m.role == "user"; });
}

StatusOr<std::string> read_data_file(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string bytes, read_raw_file(path));
  if (!path.ends_with(".xz")) return bytes;
  return xz_decompress(path, bytes);
}

StatusOr<std::vector<Conversation>> load_sharegpt(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string bytes, read_data_file(path));
  Json root = Json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return invalid_argument_error(path + ": not valid JSON (expected a ShareGPT list of "
                                  "{\"id\", \"conversations\": [{\"from\", \"value\"}]})");
  }
  if (!root.is_array()) return invalid_argument_error(path + ": expected a JSON list of records");
  std::vector<Conversation> conversations;
  for (size_t i = 0; i < root.size(); ++i) {
    StatusOr<Conversation> conversation = parse_record(root[i]);
    if (!conversation.ok()) {
      return invalid_argument_error(path + ": record " + std::to_string(i) + " " +
                                    conversation.status().message());
    }
    if (conversation->num_user_turns() > 0) conversations.push_back(*std::move(conversation));
  }
  if (conversations.empty()) {
    return invalid_argument_error(path + ": no conversation with a user message");
  }
  return conversations;
}

StatusOr<std::vector<BenchRequest>> sample_sharegpt(const std::vector<Conversation>& conversations,
                                                    const tokenizer::Tokenizer& tokenizer,
                                                    const SharegptSampling& sampling) {
  constexpr int64_t kMinLen = 4;
  std::vector<size_t> order(conversations.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(sampling.seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<BenchRequest> requests;
  for (size_t index : order) {
    if (static_cast<int64_t>(requests.size()) == sampling.num_prompts) break;
    const std::vector<Message>& messages = conversations[index].messages;
    auto user = std::find_if(messages.begin(), messages.end(),
                             [](const Message& m) { return m.role == "user"; });
    if (user == messages.end() || user + 1 == messages.end()) continue;  // no reply
    BenchRequest request;
    request.prompt = user->content;
    request.prompt_len = static_cast<int64_t>(tokenizer.encode(request.prompt, false).size());
    const int64_t reply_len =
        static_cast<int64_t>(tokenizer.encode((user + 1)->content, false).size());
    request.max_tokens = sampling.output_len > 0 ? sampling.output_len : reply_len;
    if (request.prompt_len < kMinLen || (sampling.output_len == 0 && reply_len < kMinLen) ||
        request.prompt_len > sampling.max_prompt_len ||
        request.prompt_len + request.max_tokens > sampling.max_total_len) {
      continue;
    }
    requests.push_back(std::move(request));
  }
  if (static_cast<int64_t>(requests.size()) < sampling.num_prompts) {
    return invalid_argument_error(
        "only " + std::to_string(requests.size()) + " ShareGPT prompts pass the length filter "
        "(prompt 4.." + std::to_string(sampling.max_prompt_len) + " tokens, prompt + output <= " +
        std::to_string(sampling.max_total_len) + "); asked for --num-prompts " +
        std::to_string(sampling.num_prompts));
  }
  return requests;
}

StatusOr<std::vector<BenchRequest>> random_requests(const tokenizer::Tokenizer& tokenizer,
                                                    const RandomSampling& sampling) {
  if (sampling.input_len < 1 || sampling.output_len < 1) {
    return invalid_argument_error("--random-input-len and --random-output-len must be >= 1");
  }
  if (sampling.range_ratio < 0 || sampling.range_ratio >= 1) {
    return invalid_argument_error("--random-range-ratio must be in [0, 1), got " +
                                  std::to_string(sampling.range_ratio));
  }
  std::vector<TokenId> ordinary;
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.is_special(id)) ordinary.push_back(id);
  }
  std::mt19937_64 rng(sampling.seed);
  std::uniform_int_distribution<size_t> pick(0, ordinary.size() - 1);
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> ids(static_cast<size_t>(n));
    for (TokenId& id : ids) id = ordinary[pick(rng)];
    return ids;
  };
  auto length = [&](int64_t len) {
    const auto lo = static_cast<int64_t>(std::floor(len * (1 - sampling.range_ratio)));
    const auto hi = static_cast<int64_t>(std::ceil(len * (1 + sampling.range_ratio)));
    return std::uniform_int_distribution<int64_t>(std::max<int64_t>(lo, 1), hi)(rng);
  };
  const std::vector<TokenId> prefix = random_tokens(sampling.prefix_len);
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < sampling.num_prompts; ++i) {
    std::vector<TokenId> ids = prefix;
    const std::vector<TokenId> own = random_tokens(length(sampling.input_len));
    ids.insert(ids.end(), own.begin(), own.end());
    BenchRequest request;
    request.prompt = tokenizer.decode(ids, /*skip_special=*/false);
    request.prompt_len = static_cast<int64_t>(tokenizer.encode(request.prompt, false).size());
    request.max_tokens = length(sampling.output_len);
    requests.push_back(std::move(request));
  }
  return requests;
}

StatusOr<std::vector<BenchRequest>> text_requests(const tokenizer::Tokenizer& tokenizer,
                                                  const std::string& text,
                                                  const TextSampling& sampling) {
  if (sampling.input_len < 1 || sampling.output_len < 1) {
    return invalid_argument_error("--text-input-len and --text-output-len must be >= 1");
  }
  const std::vector<TokenId> ids = tokenizer.encode(text, false);
  const int64_t windows = std::ssize(ids) / sampling.input_len;
  if (windows < sampling.num_prompts) {
    return invalid_argument_error("the text has " + std::to_string(ids.size()) +
                                  " tokens: " + std::to_string(windows) + " prompts of " +
                                  std::to_string(sampling.input_len) + ", not " +
                                  std::to_string(sampling.num_prompts));
  }
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < sampling.num_prompts; ++i) {
    const auto first = ids.begin() + i * sampling.input_len;
    BenchRequest request;
    request.prompt = tokenizer.decode({first, first + sampling.input_len}, /*skip_special=*/false);
    request.prompt_len = static_cast<int64_t>(tokenizer.encode(request.prompt, false).size());
    request.max_tokens = sampling.output_len;
    requests.push_back(std::move(request));
  }
  return requests;
}

std::vector<BenchRequest> conversation_turns(const Conversation& conversation,
                                             const tokenizer::Tokenizer& tokenizer,
                                             int64_t max_turns, int64_t max_output_len) {
  std::vector<BenchRequest> turns;
  int64_t history_len = 0;  // tokens of the messages before the current one
  const std::vector<Message>& messages = conversation.messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto len = static_cast<int64_t>(tokenizer.encode(messages[i].content, false).size());
    if (messages[i].role == "user") {
      if (max_turns > 0 && static_cast<int64_t>(turns.size()) == max_turns) break;
      BenchRequest turn;
      turn.messages.assign(messages.begin(), messages.begin() + static_cast<ptrdiff_t>(i) + 1);
      turn.prompt_len = history_len + len;
      int64_t reply_len = max_output_len;
      if (i + 1 < messages.size() && messages[i + 1].role == "assistant") {
        reply_len = static_cast<int64_t>(tokenizer.encode(messages[i + 1].content, false).size());
        if (max_output_len > 0) reply_len = std::min(reply_len, max_output_len);
      }
      turn.max_tokens = std::max<int64_t>(reply_len, 1);
      turns.push_back(std::move(turn));
    }
    history_len += len;
  }
  return turns;
}

}  // namespace strata::bench
