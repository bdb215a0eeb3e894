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

// GGUF token types beyond control and user-defined (llama.cpp's llama_token_type).
constexpr int64_t kTokenTypeNormal = 1;
constexpr int64_t kTokenTypeByte = 6;

// The special ids, BOS policy and chat template every GGUF tokenizer has.
Status read_common(const model::GgufFile& file, bool add_bos_default, detail::TokenizerSpec* spec) {
  STRATA_RETURN_IF_ERROR(read_optional_id(file, "tokenizer.ggml.bos_token_id", &spec->bos_id));
  STRATA_RETURN_IF_ERROR(read_optional_id(file, "tokenizer.ggml.eos_token_id", &spec->eos_id));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    std::optional<TokenId> id;
    STRATA_RETURN_IF_ERROR(read_optional_id(file, key, &id));
    if (id) spec->extra_stop_ids.push_back(*id);
  }
  spec->add_bos_by_default = add_bos_default;
  if (file.has_key("tokenizer.ggml.add_bos_token")) {
    STRATA_ASSIGN_OR_RETURN(spec->add_bos_by_default,
                            file.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (!spec->bos_id) spec->add_bos_by_default = false;
  if (file.has_key("tokenizer.chat_template")) {
    STRATA_ASSIGN_OR_RETURN(spec->chat_template, file.get_string("tokenizer.chat_template"));
  }
  return Status();
}

}  // namespace

// tokenizer.ggml.model = "llama": pieces, scores and token types as llama.cpp's converters write
// them from a SentencePiece model.
StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf_sentencepiece(
    const model::GgufFile& file) {
  const std::string& path = file.path();
  detail::TokenizerSpec spec;
  spec.source = path;
  // A missing or mistyped array is a malformed file, whichever the GGUF reader's code says.
  auto invalid = [&](const Status& s) {
    return invalid_argument_error("a SentencePiece tokenizer (model 'llama') needs " + s.message());
  };
  auto pieces = file.get_string_array("tokenizer.ggml.tokens");
  if (!pieces.ok()) return invalid(pieces.status());
  auto scores = file.get_float_array("tokenizer.ggml.scores");
  if (!scores.ok()) return invalid(scores.status());
  auto types = file.get_int_array("tokenizer.ggml.token_type");
  if (!types.ok()) return invalid(types.status());
  if ((*pieces)->empty() || (*scores)->size() != (*pieces)->size() ||
      (*types)->size() != (*pieces)->size()) {
    return invalid_argument_error(
        "tokenizer.ggml.tokens, scores and token_type disagree in size in " + path);
  }
  detail::SpmModelParams spm;
  spm.pieces = **pieces;
  for (size_t i = 0; i < spm.pieces.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    const int64_t type = (**types)[i];
    spm.scores.push_back(static_cast<float>((**scores)[i]));
    spm.is_byte.push_back(type == kTokenTypeByte);
    spm.is_normal.push_back(type == kTokenTypeNormal);
    if (type == kTokenTypeControl || type == kTokenTypeUserDefined) {
      spec.added_tokens.push_back(detail::AddedTokenSpec{
          .id = id, .content = spm.pieces[i], .special = type == kTokenTypeControl});
    }
  }
  STRATA_RETURN_IF_ERROR(read_optional_id(file, "tokenizer.ggml.unknown_token_id", &spm.unk_id));
  if (file.has_key("tokenizer.ggml.add_space_prefix")) {
    STRATA_ASSIGN_OR_RETURN(spm.add_space_prefix, file.get_bool("tokenizer.ggml.add_space_prefix"));
  }
  spec.spm = std::move(spm);
  STRATA_RETURN_IF_ERROR(read_common(file, /*add_bos_default=*/true, &spec));
  return from_spec(std::move(spec));
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const model::GgufFile& file) {
  const std::string& path = file.path();
  detail::TokenizerSpec spec;
  spec.source = path;

  auto model_name = file.get_string("tokenizer.ggml.model");
  if (!model_name.ok()) {
    return invalid_argument_error("no tokenizer.ggml.model in " + path + ": " +
                                  model_name.status().message());
  }
  if (*model_name == "llama") return from_gguf_sentencepiece(file);
  if (*model_name != "gpt2") {
    return unimplemented_error("tokenizer model '" + *model_name + "' in " + path +
                               " is not supported; 'gpt2' (byte-level BPE) and 'llama' "
                               "(SentencePiece BPE) are");
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

  STRATA_RETURN_IF_ERROR(
      read_optional_id(file, "tokenizer.ggml.unknown_token_id", &spec.bpe.unk_id));
  STRATA_RETURN_IF_ERROR(read_common(file, pre->add_bos, &spec));
  return from_spec(std::move(spec));
}

}  // namespace strata::tokenizer
