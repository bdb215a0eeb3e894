// Tokenizer::from_tokenizer_json: the subset of HF tokenizer.json used by byte-level BPE models.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "pre_tokenizer.h"
#include "strata/tokenizer/tokenizer.h"
#include "tokenizer_spec.h"

namespace strata::tokenizer {
namespace {

using nlohmann::json;

StatusOr<json> read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("cannot open " + path.string());
  std::ostringstream contents;
  contents << in.rdbuf();
  json parsed = json::parse(contents.str(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return invalid_argument_error(path.string() + " is not valid JSON");
  return parsed;
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("<no type>");
}

bool is_token_id(const json& j) {
  return j.is_number_integer() && j.get<int64_t>() >= 0 && j.get<int64_t>() <= INT32_MAX;
}

bool get_bool_or(const json& j, const char* key, bool fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// Empty or null string field.
bool is_unset_string(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

// Appends the Isolated-split patterns of `pre` to spec->pre_tokenizer_patterns.
// *byte_level is set once a ByteLevel step was seen; it must be the last step, since the regexes
// are applied to raw text and the byte mapping happens at BPE time.
Status parse_pre_tokenizer(const json& pre, detail::TokenizerSpec* spec, bool* byte_level) {
  if (pre.is_null()) return Status();
  const std::string type = type_of(pre);
  if (*byte_level) {
    return unimplemented_error("pre-tokenizer step '" + type + "' after ByteLevel");
  }
  if (type == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) {
      return invalid_argument_error("Sequence pre-tokenizer without 'pretokenizers'");
    }
    for (const json& step : pre["pretokenizers"]) {
      STRATA_RETURN_IF_ERROR(parse_pre_tokenizer(step, spec, byte_level));
    }
    return Status();
  }
  if (type == "ByteLevel") {
    if (get_bool_or(pre, "add_prefix_space", false)) {
      return unimplemented_error("ByteLevel pre-tokenizer with add_prefix_space = true");
    }
    if (get_bool_or(pre, "use_regex", true))
      spec->pre_tokenizer_patterns.push_back(detail::kGpt2Pattern);
    *byte_level = true;
    return Status();
  }
  if (type == "Split") {
    const std::string behavior = pre.value("behavior", std::string());
    if (behavior != "Isolated") {
      return unimplemented_error("Split pre-tokenizer with behavior '" + behavior +
                                 "' (only Isolated is supported)");
    }
    if (get_bool_or(pre, "invert", false)) {
      return unimplemented_error("Split pre-tokenizer with invert = true");
    }
    const json& pattern = pre.value("pattern", json());
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      spec->pre_tokenizer_patterns.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      spec->pre_tokenizer_patterns.push_back(
          detail::escape_regex_literal(pattern["String"].get<std::string>()));
    } else {
      return invalid_argument_error("Split pre-tokenizer without a Regex or String pattern");
    }
    return Status();
  }
  if (type == "Digits") {
    spec->pre_tokenizer_patterns.push_back(
        get_bool_or(pre, "individual_digits", false) ? "\\p{N}" : "\\p{N}+");
    return Status();
  }
  return unimplemented_error("pre-tokenizer '" + type + "'");
}

// Sets *bos when the post-processor prepends one special token; rejects anything that adds more.
Status parse_post_processor(const json& post, std::optional<TokenId>* bos) {
  if (post.is_null()) return Status();
  const std::string type = type_of(post);
  if (type == "ByteLevel") return Status();  // only adjusts offsets
  if (type == "Sequence") {
    for (const json& step : post.value("processors", json::array())) {
      STRATA_RETURN_IF_ERROR(parse_post_processor(step, bos));
    }
    return Status();
  }
  if (type != "TemplateProcessing") return unimplemented_error("post-processor '" + type + "'");
  const json& single = post.value("single", json::array());
  const auto is_sequence_a = [](const json& piece) {
    return piece.contains("Sequence") && piece["Sequence"].value("id", std::string()) == "A";
  };
  if (single.size() == 1 && is_sequence_a(single[0])) return Status();
  if (single.size() == 2 && single[0].contains("SpecialToken") && is_sequence_a(single[1])) {
    const std::string name = single[0]["SpecialToken"].value("id", std::string());
    const json& special_tokens = post.value("special_tokens", json::object());
    if (!special_tokens.contains(name)) {
      return invalid_argument_error("TemplateProcessing names special token '" + name +
                                    "' without defining it");
    }
    const json& ids = special_tokens[name].value("ids", json::array());
    if (ids.size() != 1 || !is_token_id(ids[0])) {
      return unimplemented_error("TemplateProcessing special token '" + name +
                                 "' that is not exactly one id");
    }
    *bos = ids[0].get<TokenId>();
    return Status();
  }
  return unimplemented_error(
      "TemplateProcessing post-processor other than '$A' or '<bos> $A' (single = " + single.dump() +
      ")");
}

// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> config_token(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

// chat_template in tokenizer_config.json: a string or a list of {name, template}.
std::string config_chat_template(const json& config) {
  const auto it = config.find("chat_template");
  if (it == config.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& entry : *it) {
      if (entry.value("name", std::string()) == "default" && entry.contains("template")) {
        return entry["template"].get<std::string>();
      }
    }
  }
  return {};
}

Status parse_model(const json& model, detail::TokenizerSpec* spec) {
  const std::string type = type_of(model);
  if (type != "BPE") return unimplemented_error("tokenizer model type '" + type + "'");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    return unimplemented_error("BPE dropout");
  }
  if (!is_unset_string(model, "continuing_subword_prefix")) {
    return unimplemented_error("BPE continuing_subword_prefix");
  }
  if (!is_unset_string(model, "end_of_word_suffix")) {
    return unimplemented_error("BPE end_of_word_suffix");
  }
  if (get_bool_or(model, "byte_fallback", false)) return unimplemented_error("BPE byte_fallback");
  spec->bpe.ignore_merges = get_bool_or(model, "ignore_merges", false);

  const json& vocab = model.value("vocab", json());
  if (!vocab.is_object()) return invalid_argument_error("model.vocab is not an object");
  spec->bpe.vocab.reserve(vocab.size());
  for (const auto& [text, id] : vocab.items()) {
    if (!is_token_id(id)) {
      return invalid_argument_error("model.vocab['" + text + "'] = " + id.dump() +
                                    " is not a token id");
    }
    spec->bpe.vocab.emplace_back(text, id.get<TokenId>());
  }
  const json& merges = model.value("merges", json());
  if (!merges.is_array()) return invalid_argument_error("model.merges is not an array");
  spec->bpe.merges.reserve(merges.size());
  for (const json& merge : merges) {
    if (merge.is_string()) {  // legacy "left right"
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ', 1);
      if (space == std::string::npos) {
        return invalid_argument_error("BPE merge '" + text + "' is not 'left right'");
      }
      spec->bpe.merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      spec->bpe.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return invalid_argument_error("BPE merge " + merge.dump() + " is not a pair of strings");
    }
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string unk = model["unk_token"].get<std::string>();
    for (const auto& [text, id] : spec->bpe.vocab) {
      if (text == unk) spec->bpe.unk_id = id;
    }
  }
  return Status();
}

// Unicode normalizers (NFC, NFD, NFKC, NFKD), alone or in a Sequence; anything else (Lowercase,
// Prepend, Replace, ...) is UNIMPLEMENTED naming it.
Status parse_normalizer(const json& normalizer, detail::TokenizerSpec* spec) {
  if (normalizer.is_null()) return Status();
  const std::string type = type_of(normalizer);
  if (type == "Sequence") {
    for (const json& part : normalizer.value("normalizers", json::array())) {
      STRATA_RETURN_IF_ERROR(parse_normalizer(part, spec));
    }
    return Status();
  }
  using detail::NormalizationForm;
  if (type == "NFC") {
    spec->normalization.push_back(NormalizationForm::kNfc);
  } else if (type == "NFD") {
    spec->normalization.push_back(NormalizationForm::kNfd);
  } else if (type == "NFKC") {
    spec->normalization.push_back(NormalizationForm::kNfkc);
  } else if (type == "NFKD") {
    spec->normalization.push_back(NormalizationForm::kNfkd);
  } else {
    return unimplemented_error("normalizer '" + type + "' (NFC, NFD, NFKC and NFKD are supported)");
  }
  return Status();
}

// A SentencePiece model in tokenizer.json (HF's conversion of one): model Unigram, or BPE with
// byte_fallback; the "▁" escaping as the normalizers Prepend("▁") + Replace(" ", "▁") or the
// Metaspace pre-tokenizer; a decoder that undoes it (Replace, ByteFallback, Fuse, Strip, or
// Metaspace). BPE merges become piece scores: a piece scores minus the rank of its first merge,
// which is how SentencePiece orders them (HF's converter writes every split of a piece into two
// pieces as a merge, ranked by the piece).
Status parse_sentencepiece(const json& root, detail::TokenizerSpec* spec) {
  const json& model = root["model"];
  detail::SpmModelParams spm;
  std::vector<std::pair<std::string, double>> pieces;  // by id
  if (type_of(model) == "Unigram") {
    spm.kind = detail::SpmModelParams::Kind::kUnigram;
    for (const json& entry : model.value("vocab", json::array())) {
      if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() ||
          !entry[1].is_number()) {
        return invalid_argument_error("Unigram vocab entry " + entry.dump() +
                                      " is not [piece, score]");
      }
      pieces.emplace_back(entry[0].get<std::string>(), entry[1].get<double>());
    }
    if (model.contains("unk_id") && model["unk_id"].is_number_integer()) {
      spm.unk_id = model["unk_id"].get<TokenId>();
    }
  } else {
    const json& vocab = model.value("vocab", json::object());
    for (const auto& [text, id] : vocab.items()) {
      if (!is_token_id(id))
        return invalid_argument_error("model.vocab['" + text + "'] is not an id");
      const auto i = static_cast<size_t>(id.get<TokenId>());
      if (pieces.size() <= i) pieces.resize(i + 1);
      pieces[i] = {text, 0.0};
    }
    std::unordered_map<std::string, size_t> id_of;
    for (size_t i = 0; i < pieces.size(); ++i) id_of.emplace(pieces[i].first, i);
    std::vector<bool> scored(pieces.size(), false);
    int64_t rank = 0;
    for (const json& merge : model.value("merges", json::array())) {
      std::string merged;
      if (merge.is_string()) {
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ', 1);
        if (space == std::string::npos) return invalid_argument_error("BPE merge '" + text + "'");
        merged = text.substr(0, space) + text.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2) {
        merged = merge[0].get<std::string>() + merge[1].get<std::string>();
      } else {
        return invalid_argument_error("BPE merge " + merge.dump() + " is not a pair of strings");
      }
      auto it = id_of.find(merged);
      if (it != id_of.end() && !scored[it->second]) {
        pieces[it->second].second = -static_cast<double>(rank);
        scored[it->second] = true;
      }
      ++rank;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = id_of.find(model["unk_token"].get<std::string>());
      if (it != id_of.end()) spm.unk_id = static_cast<TokenId>(it->second);
    }
  }
  std::unordered_set<std::string> added;
  for (const json& token : root.value("added_tokens", json::array())) {
    added.insert(token.value("content", std::string()));
  }
  for (const auto& [piece, score] : pieces) {
    const bool is_byte = piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece.back() == '>';
    spm.pieces.push_back(piece);
    spm.scores.push_back(static_cast<float>(score));
    spm.is_byte.push_back(is_byte);
    spm.is_normal.push_back(!is_byte && !added.contains(piece));
  }
  // The escaping: normalizers Prepend("▁") + Replace(" ", "▁"), or a Metaspace pre-tokenizer.
  const json& normalizer = root.value("normalizer", json());
  const json& pre = root.value("pre_tokenizer", json());
  bool escaped = false;
  if (type_of(normalizer) == "Sequence") {
    for (const json& part : normalizer.value("normalizers", json::array())) {
      const std::string t = type_of(part);
      if (t == "Prepend" && part.value("prepend", "") == "\u2581") {
        escaped = true;
      } else if (t != "Replace" || part.value("content", "") != "\u2581") {
        return unimplemented_error("SentencePiece normalizer '" + t + "'");
      }
    }
  } else if (!normalizer.is_null()) {
    return unimplemented_error("SentencePiece normalizer '" + type_of(normalizer) + "'");
  }
  if (type_of(pre) == "Metaspace") {
    if (pre.value("prepend_scheme", "always") != "always") {
      return unimplemented_error("Metaspace prepend_scheme '" + pre.value("prepend_scheme", "") +
                                 "' (only \"always\")");
    }
    escaped = true;
  } else if (!pre.is_null()) {
    return unimplemented_error("SentencePiece pre-tokenizer '" + type_of(pre) + "'");
  }
  if (!escaped) return unimplemented_error("SentencePiece model without the \"\u2581\" escaping");
  spm.add_space_prefix = true;
  spec->spm = std::move(spm);
  return Status();
}

Status parse_tokenizer_json(const json& root, detail::TokenizerSpec* spec,
                            std::optional<TokenId>* post_bos) {
  if (!root.is_object()) return invalid_argument_error("top level is not an object");
  const json& model = root.value("model", json());
  if (type_of(model) == "Unigram" ||
      (type_of(model) == "BPE" && get_bool_or(model, "byte_fallback", false))) {
    STRATA_RETURN_IF_ERROR(parse_sentencepiece(root, spec));
  } else {
    STRATA_RETURN_IF_ERROR(parse_model(model, spec));
    STRATA_RETURN_IF_ERROR(parse_normalizer(root.value("normalizer", json()), spec));
    bool byte_level = false;
    STRATA_RETURN_IF_ERROR(
        parse_pre_tokenizer(root.value("pre_tokenizer", json()), spec, &byte_level));
    if (!byte_level) {
      return unimplemented_error("pre-tokenizer without ByteLevel (not byte-level BPE)");
    }
    const json& decoder = root.value("decoder", json());
    if (type_of(decoder) != "ByteLevel") {
      return unimplemented_error("decoder '" + type_of(decoder) +
                                 "' (only ByteLevel is supported)");
    }
  }
  STRATA_RETURN_IF_ERROR(parse_post_processor(root.value("post_processor", json()), post_bos));

  for (const json& token : root.value("added_tokens", json::array())) {
    if (!token.contains("id") || !is_token_id(token["id"]) || !token.contains("content") ||
        !token["content"].is_string()) {
      return invalid_argument_error("added token " + token.dump() + " lacks id or content");
    }
    if (get_bool_or(token, "single_word", false)) {
      return unimplemented_error("added token '" + token["content"].get<std::string>() +
                                 "' with single_word = true");
    }
    spec->added_tokens.push_back(
        detail::AddedTokenSpec{.id = token["id"].get<TokenId>(),
                               .content = token["content"].get<std::string>(),
                               .special = get_bool_or(token, "special", false),
                               .lstrip = get_bool_or(token, "lstrip", false),
                               .rstrip = get_bool_or(token, "rstrip", false),
                               .normalized = get_bool_or(token, "normalized", false)});
  }
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_tokenizer_json(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const json root, read_json(path));
  detail::TokenizerSpec spec;
  spec.source = path;
  std::optional<TokenId> post_bos;
  Status parsed;
  try {
    parsed = parse_tokenizer_json(root, &spec, &post_bos);
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    parsed = invalid_argument_error(std::string("malformed tokenizer.json: ") + e.what());
  }
  if (!parsed.ok()) return Status(parsed.code(), parsed.message() + " in " + path);

  auto id_of = [&](const std::string& text) -> std::optional<TokenId> {
    for (const auto& token : spec.added_tokens) {
      if (token.content == text) return token.id;
    }
    for (const auto& [vocab_text, id] : spec.bpe.vocab) {
      if (vocab_text == text) return id;
    }
    if (spec.spm) {
      const auto& pieces = spec.spm->pieces;
      auto it = std::find(pieces.begin(), pieces.end(), text);
      if (it != pieces.end()) return static_cast<TokenId>(it - pieces.begin());
    }
    return std::nullopt;
  };

  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  json config = json::object();
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    STRATA_ASSIGN_OR_RETURN(config, read_json(dir / "tokenizer_config.json"));
    if (!config.is_object()) {
      return invalid_argument_error((dir / "tokenizer_config.json").string() +
                                    " is not a JSON object");
    }
  }
  try {
    spec.chat_template = config_chat_template(config);
  } catch (const json::exception& e) {
    return invalid_argument_error("malformed chat_template in tokenizer_config.json beside " +
                                  path + ": " + e.what());
  }
  if (spec.chat_template.empty() && std::filesystem::exists(dir / "chat_template.jinja")) {
    std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
    std::ostringstream contents;
    contents << in.rdbuf();
    spec.chat_template = contents.str();
  }
  if (const auto bos = config_token(config, "bos_token")) spec.bos_id = id_of(*bos);
  if (const auto eos = config_token(config, "eos_token")) spec.eos_id = id_of(*eos);
  if (post_bos) {
    spec.bos_id = post_bos;
    spec.add_bos_by_default = true;
  } else {
    spec.add_bos_by_default = get_bool_or(config, "add_bos_token", false) && spec.bos_id;
  }
  return from_spec(std::move(spec));
}

}  // namespace strata::tokenizer
