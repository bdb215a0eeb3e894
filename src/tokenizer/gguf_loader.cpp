// Tokenizer::from_gguf: reads the tokenizer.ggml.* metadata written by llama.cpp's converters.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "strata/model/gguf_file.h"
#include "strata/tokenizer/tokenizer.h"
#include "tokenizer_spec.h"

namespace strata::tokenizer {
namespace {

// GGUF token types (llama.cpp's llama_token_type).
constexpr int64_t kTokenTypeControl = 3;
constexpr int64_t kTokenTypeUserDefined = 4;

// Pre-tokenizer regexes, as llama.cpp's llm_tokenizer_bpe (HF tokenizer.json spelling).
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreTokenizerConfig {
  std::vector<std::string> patterns;
  bool ignore_merges = false;
  bool add_bos = false;  // default of tokenizer.ggml.add_bos_token
};

// tokenizer.ggml.pre -> regexes; nullopt for a name we do not know.
std::optional<PreTokenizerConfig> pre_tokenizer_config(std::string_view name) {
  auto is_one_of = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  if (name == "default") {
    // llama.cpp's fallback for files without a known pre-tokenizer (not GPT-2's regex).
    return PreTokenizerConfig{{"[\\p{P}\\$\\+<=>\\^~\\|]+",
                               "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                               "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
                               "\\p{N}+", "[0-9][0-9][0-9]"}};
  }
  if (is_one_of({"gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais"})) {
    return PreTokenizerConfig{{detail::kGpt2Pattern}};
  }
  if (is_one_of({"llama3", "llama-v3", "llama-bpe", "falcon3"})) {
    return PreTokenizerConfig{{kLlama3Pattern}, /*ignore_merges=*/true, /*add_bos=*/true};
  }
  if (is_one_of({"dbrx", "smaug-bpe"})) return PreTokenizerConfig{{kLlama3Pattern}};
  if (is_one_of({"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"})) {
    return PreTokenizerConfig{{kQwen2Pattern}};
  }
  if (is_one_of(
          {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
    return PreTokenizerConfig{{"\\p{N}", detail::kGpt2Pattern}};
  }
  return std::nullopt;
}

// Optional integer key as a token id; NOT_FOUND is "absent", other errors pass through.
Status read_optional_id(const model::GgufFile& file, std::string_view key,
                        std::optional<TokenId>* id) {
  auto value = file.get_int(key);
  if (!value.ok()) {
    if (value.status().code() == StatusCode::kNotFound) return Status();
    return value.status();
  }
  if (*value < 0 || *value > INT32_MAX) {
    return invalid_argument_error(std::string(key) + " = " + std::to_string(*value) +
                                  " is not a token id in " + file.path());
  }
  *id = static_cast<TokenId>(*value);
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const model::GgufFile& file) {
  const std::string& path = file.path();
  detail::TokenizerSpec spec;
  spec.source = path;

  auto model_name = file.get_string("tokenizer.ggml.model");
  if (!model_name.ok()) {
    return invalid_argument_error("no tokenizer.ggml.model in " + path + ": " +
                                  model_name.status().message());
  }
  if (*model_name != "gpt2") {
    return unimplemented_error("tokenizer model '" + *model_name + "' in " + path +
                               " is not supported; only 'gpt2' (byte-level BPE) is");
  }

  std::string pre_name = "default";
  if (file.has_key("tokenizer.ggml.pre")) {
    STRATA_ASSIGN_OR_RETURN(pre_name, file.get_string("tokenizer.ggml.pre"));
  }
  auto pre = pre_tokenizer_config(pre_name);
  if (!pre) {
    return unimplemented_error("unknown pre-tokenizer tokenizer.ggml.pre = '" + pre_name + "' in " +
                               path);
  }
  spec.pre_tokenizer_patterns = pre->patterns;
  spec.bpe.ignore_merges = pre->ignore_merges;

  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens.ok()) {
    return invalid_argument_error("no usable tokenizer.ggml.tokens in " + path + ": " +
                                  tokens.status().message());
  }
  const std::vector<std::string>& token_texts = **tokens;
  if (token_texts.empty() || token_texts.size() > static_cast<size_t>(INT32_MAX)) {
    return invalid_argument_error("tokenizer.ggml.tokens has " +
                                  std::to_string(token_texts.size()) + " entries in " + path);
  }
  auto merges = file.get_string_array("tokenizer.ggml.merges");
  if (!merges.ok()) {
    return invalid_argument_error(
        "no usable tokenizer.ggml.merges in " + path +
        " (a gpt2 tokenizer needs its BPE merges): " + merges.status().message());
  }
  const std::vector<int64_t>* token_types = nullptr;
  if (file.has_key("tokenizer.ggml.token_type")) {
    STRATA_ASSIGN_OR_RETURN(token_types, file.get_int_array("tokenizer.ggml.token_type"));
    if (token_types->size() != token_texts.size()) {
      return invalid_argument_error(
          "tokenizer.ggml.token_type has " + std::to_string(token_types->size()) +
          " entries but there are " + std::to_string(token_texts.size()) + " tokens in " + path);
    }
  }

  spec.bpe.vocab.reserve(token_texts.size());
  for (size_t i = 0; i < token_texts.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    spec.bpe.vocab.emplace_back(token_texts[i], id);
    const int64_t type = token_types != nullptr ? (*token_types)[i] : 1;
    if (type == kTokenTypeControl || type == kTokenTypeUserDefined) {
      const bool special = type == kTokenTypeControl;
      spec.added_tokens.push_back(detail::AddedTokenSpec{
          .id = id, .content = token_texts[i], .special = special, .normalized = !special});
    }
  }
  spec.bpe.merges.reserve((*merges)->size());
  for (const std::string& merge : **merges) {
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) {
      return invalid_argument_error("BPE merge '" + merge + "' is not 'left right' in " + path);
    }
    spec.bpe.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }

  STRATA_RETURN_IF_ERROR(read_optional_id(file, "tokenizer.ggml.bos_token_id", &spec.bos_id));
  STRATA_RETURN_IF_ERROR(read_optional_id(file, "tokenizer.ggml.eos_token_id", &spec.eos_id));
  STRATA_RETURN_IF_ERROR(
      read_optional_id(file, "tokenizer.ggml.unknown_token_id", &spec.bpe.unk_id));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    std::optional<TokenId> id;
    STRATA_RETURN_IF_ERROR(read_optional_id(file, key, &id));
    if (id) spec.extra_stop_ids.push_back(*id);
  }
  spec.add_bos_by_default = pre->add_bos;
  if (file.has_key("tokenizer.ggml.add_bos_token")) {
    STRATA_ASSIGN_OR_RETURN(spec.add_bos_by_default, file.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (!spec.bos_id) spec.add_bos_by_default = false;
  if (file.has_key("tokenizer.chat_template")) {
    STRATA_ASSIGN_OR_RETURN(spec.chat_template, file.get_string("tokenizer.chat_template"));
  }
  return from_spec(std::move(spec));
}

}  // namespace strata::tokenizer
