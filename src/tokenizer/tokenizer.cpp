#include "strata/tokenizer/tokenizer.h"

#include <algorithm>
#include <deque>

#include "added_vocab.h"
#include "bpe_model.h"
#include "byte_level.h"
#include "normalizer.h"
#include "pre_tokenizer.h"
#include "spm_model.h"
#include "strata/common/check.h"
#include "strata/tokenizer/chat_template.h"
#include "tokenizer_spec.h"
#include "utf8.h"

namespace strata::tokenizer {
namespace {

// Token texts that end a turn in the chat formats we know.
constexpr const char* kEndOfTurnTokens[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>",
                                            "<|endoftext|>"};

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_spec(detail::TokenizerSpec spec) {
  const std::string where = " in " + spec.source;
  int64_t num_ids = 0;
  for (const auto& [text, id] : spec.bpe.vocab) {
    if (id < 0) return invalid_argument_error("negative token id for '" + text + "'" + where);
    num_ids = std::max<int64_t>(num_ids, int64_t{id} + 1);
  }
  for (const auto& token : spec.added_tokens) {
    if (token.id < 0) {
      return invalid_argument_error("negative id for added token '" + token.content + "'" + where);
    }
    num_ids = std::max<int64_t>(num_ids, int64_t{token.id} + 1);
  }
  if (spec.spm) num_ids = std::max<int64_t>(num_ids, std::ssize(spec.spm->pieces));
  if (num_ids == 0) return invalid_argument_error("empty vocabulary" + where);
  // Tables are sized by the largest id: ids far past the number of tokens (found by fuzzing: one
  // id of 444,444,444 asked for 14 GB) are a corrupt file, not a vocabulary.
  const int64_t num_tokens = std::ssize(spec.bpe.vocab) + std::ssize(spec.added_tokens) +
                             (spec.spm ? std::ssize(spec.spm->pieces) : 0);
  if (num_ids > 2 * num_tokens + 1024) {
    return invalid_argument_error("token ids up to " + std::to_string(num_ids - 1) + " for " +
                                  std::to_string(num_tokens) + " tokens" + where);
  }

  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  Tokenizer& t = *tokenizer;
  t.token_bytes_.resize(static_cast<size_t>(num_ids));
  t.is_special_.assign(static_cast<size_t>(num_ids), 0);
  // HF's ByteLevel decoder maps a token's characters back to bytes when all of them are byte
  // characters and keeps the text as is otherwise; added tokens go through it too.
  auto bytes_of = [](const std::string& text) {
    return detail::byte_level_decode(text).value_or(text);
  };
  for (const auto& [text, id] : spec.bpe.vocab) t.token_bytes_[id] = bytes_of(text);
  for (const auto& token : spec.added_tokens) {
    t.token_bytes_[token.id] = bytes_of(token.content);
    t.is_special_[token.id] = token.special ? 1 : 0;
  }

  auto check_id = [&](const std::optional<TokenId>& id, const char* what) -> Status {
    if (id && (*id < 0 || *id >= num_ids)) {
      return invalid_argument_error(std::string(what) + " id " + std::to_string(*id) +
                                    " is outside the vocabulary of " + std::to_string(num_ids) +
                                    where);
    }
    return Status();
  };
  STRATA_RETURN_IF_ERROR(check_id(spec.bos_id, "bos"));
  STRATA_RETURN_IF_ERROR(check_id(spec.eos_id, "eos"));
  STRATA_RETURN_IF_ERROR(check_id(spec.bpe.unk_id, "unknown-token"));
  for (TokenId id : spec.extra_stop_ids) STRATA_RETURN_IF_ERROR(check_id(id, "end-of-turn"));
  if (spec.add_bos_by_default && !spec.bos_id) {
    return invalid_argument_error("BOS is to be added but the vocabulary has no BOS token" + where);
  }

  if (spec.spm) {
    for (size_t id = 0; id < spec.spm->pieces.size(); ++id) {
      t.token_bytes_[id] =
          detail::SpmModel::piece_bytes(spec.spm->pieces[id], spec.spm->is_byte[id]);
    }
    for (const auto& token : spec.added_tokens) t.token_bytes_[token.id] = token.content;
    auto spm = detail::SpmModel::create(std::move(*spec.spm));
    if (!spm.ok()) return Status(spm.status().code(), spm.status().message() + where);
    t.spm_ = std::move(spm).value();
  } else {
    auto pre_tokenizer = detail::PreTokenizer::create(spec.pre_tokenizer_patterns);
    if (!pre_tokenizer.ok()) {
      return Status(pre_tokenizer.status().code(), pre_tokenizer.status().message() + where);
    }
    t.pre_tokenizer_ = std::move(pre_tokenizer).value();
    auto bpe = detail::BpeModel::create(std::move(spec.bpe));
    if (!bpe.ok()) return Status(bpe.status().code(), bpe.status().message() + where);
    t.bpe_ = std::move(bpe).value();
  }
  t.added_vocab_ = std::make_unique<detail::AddedVocab>(spec.added_tokens);
  if (!spec.normalization.empty()) {
    STRATA_ASSIGN_OR_RETURN(t.normalizer_, detail::Normalizer::create(spec.normalization));
  }

  t.bos_id_ = spec.bos_id;
  t.eos_id_ = spec.eos_id;
  t.add_bos_by_default_ = spec.add_bos_by_default;
  t.chat_template_source_ = std::move(spec.chat_template);
  if (t.eos_id_) t.stop_ids_.push_back(*t.eos_id_);
  t.stop_ids_.insert(t.stop_ids_.end(), spec.extra_stop_ids.begin(), spec.extra_stop_ids.end());
  for (const char* text : kEndOfTurnTokens) {
    if (const auto id = t.token_to_id(text)) t.stop_ids_.push_back(*id);
  }
  std::sort(t.stop_ids_.begin(), t.stop_ids_.end());
  t.stop_ids_.erase(std::unique(t.stop_ids_.begin(), t.stop_ids_.end()), t.stop_ids_.end());
  return tokenizer;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_bos) const {
  return encode_spans(text, add_bos, {});
}

std::vector<TokenId> Tokenizer::encode(const ChatPrompt& prompt) const {
  return encode_spans(prompt.text, /*add_bos=*/false, prompt.untrusted);
}

std::vector<TokenId> Tokenizer::encode_spans(
    std::string_view text, bool add_bos,
    std::span<const std::pair<uint32_t, uint32_t>> untrusted) const {
  std::string valid_text;
  if (!detail::is_valid_utf8(text)) {
    // Replacement would shift the untrusted ranges; ChatTemplate renders valid UTF-8 only.
    STRATA_CHECK(untrusted.empty()) << "a chat prompt with invalid UTF-8";
    valid_text = detail::to_valid_utf8(text);
    text = valid_text;
  }
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_) ids.push_back(*bos_id_);
  std::vector<detail::AddedVocab::Segment> segments;
  std::deque<std::string> normalized;  // what the segments view when there is a normalizer
  added_vocab_->split(text, untrusted, normalizer_.get(), &normalized, &segments);
  bool after_added = true;  // SentencePiece prefixes "▁" at the start and after added tokens
  for (const auto& segment : segments) {
    if (segment.id) {
      ids.push_back(*segment.id);
      after_added = true;
    } else if (spm_) {
      spm_->encode(segment.text, after_added, &ids);
      after_added = false;
    } else {
      encode_ordinary(segment.text, &ids);
    }
  }
  return ids;
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<TokenId>* out) const {
  std::vector<std::string_view> pieces;
  pre_tokenizer_->split(text, &pieces);
  for (std::string_view piece : pieces) bpe_->encode_piece(piece, out);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && is_special_[id]) continue;
    bytes.append(token_bytes_[id]);
  }
  if (detail::is_valid_utf8(bytes)) return bytes;
  return detail::to_valid_utf8(bytes);
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  STRATA_CHECK(id >= 0 && id < vocab_size())
      << "token id " << id << " outside [0, " << vocab_size() << ")";
  return token_bytes_[id];
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token_text) const {
  if (const auto id = added_vocab_->find(token_text)) return id;
  return spm_ ? spm_->find(token_text) : bpe_->find(token_text);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && id < vocab_size() && is_special_[id] != 0;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(TokenId id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) return {};
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_.append(tokenizer_.token_bytes(id));
  std::string text;
  const size_t consumed = detail::append_utf8_lossy(pending_, /*final=*/false, &text);
  pending_.erase(0, consumed);
  return text;
}

std::string StreamDecoder::flush() {
  std::string text;
  detail::append_utf8_lossy(pending_, /*final=*/true, &text);
  pending_.clear();
  return text;
}

}  // namespace strata::tokenizer
