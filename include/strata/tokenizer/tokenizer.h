// Byte-level BPE tokenizer (GPT-2 family: SmolLM, Llama 3, Qwen2, ...) loaded from GGUF metadata or
// from a Hugging Face tokenizer.json, with output identical to HF `tokenizers` for the supported
// configurations (see docs/tokenizer.md for what is supported and what is rejected).
//
// Pipeline of encode(): added/special tokens are matched in the raw text first (leftmost-longest,
// as HF does); every other span is split by the pre-tokenizer regexes, each piece is mapped to
// GPT-2 byte characters and merged by BPE rank.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/status.h"

namespace strata::model {
class GgufFile;
}  // namespace strata::model

namespace strata::tokenizer {

// Index into the vocabulary: 0 <= id < Tokenizer::vocab_size().
using TokenId = int32_t;

struct ChatPrompt;

namespace detail {
struct TokenizerSpec;
class AddedVocab;
class BpeModel;
class PreTokenizer;
class Normalizer;
class SpmModel;
}  // namespace detail

// Immutable after construction; every method is const and safe to call from many threads at once.
class Tokenizer {
 public:
  // From GGUF metadata (tokenizer.ggml.*). tokenizer.ggml.model is "gpt2" (byte-level BPE) or
  // "llama" (SentencePiece BPE with byte fallback: Llama 1/2, Mistral; spm_model.h); UNIMPLEMENTED
  // naming any other. tokenizer.ggml.pre selects the pre-tokenizer regexes as llama.cpp
  // does ("gpt-2"/"gpt2", "smollm", "llama-bpe" (Llama 3), "qwen2", "default" and a few aliases);
  // an unknown name is UNIMPLEMENTED naming it. Missing tokens or merges, array-size mismatches,
  // merges naming tokens not in the vocabulary and out-of-range special ids are INVALID_ARGUMENT.
  // Tokens of type CONTROL are special added tokens, USER_DEFINED ones are non-special added
  // tokens. The file is only read during the call.
  static StatusOr<std::unique_ptr<Tokenizer>> from_gguf(const model::GgufFile& file);

  // From a Hugging Face tokenizer.json: model.type "BPE" over ByteLevel, normalizer null or
  // Unicode normalization (NFC, NFD, NFKC, NFKD, alone or in a Sequence),
  // pre_tokenizer made of Sequence / Split(Isolated) / ByteLevel / Digits, decoder ByteLevel,
  // post_processor null, ByteLevel or TemplateProcessing that only prepends a BOS. Anything else is
  // UNIMPLEMENTED naming the component; NOT_FOUND if the file cannot be read, INVALID_ARGUMENT if
  // it is not valid JSON or is malformed. tokenizer_config.json (chat_template, bos_token,
  // eos_token, add_bos_token) and chat_template.jinja beside it are read when present.
  static StatusOr<std::unique_ptr<Tokenizer>> from_tokenizer_json(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, preceded by bos_id() when `add_bos` is true and the vocabulary has one.
  // Added and special tokens written in `text` (e.g. "<|im_start|>") become their ids, as in HF.
  // Invalid UTF-8 in `text` is first replaced by U+FFFD (one per maximal invalid subpart).
  std::vector<TokenId> encode(std::string_view text, bool add_bos) const;
  // Token ids of a rendered chat prompt, without adding BOS (the template writes it): as encode(),
  // except that special tokens are only matched outside prompt.untrusted, so request text such as
  // "<|im_start|>system" is tokenized as the characters it is (HF's encode_special_tokens there).
  std::vector<TokenId> encode(const ChatPrompt& prompt) const;

  // Text of `ids`: the raw bytes of the tokens concatenated, then decoded as UTF-8 with every
  // invalid or incomplete sequence replaced by U+FFFD, exactly like HF decode(). Ids outside
  // [0, vocab_size()) are skipped, as HF does. With `skip_special`, special tokens are left out.
  std::string decode(std::span<const TokenId> ids, bool skip_special) const;

  // The raw bytes token `id` stands for (may be a partial UTF-8 sequence).
  // REQUIRES: 0 <= id < vocab_size() (checked).
  const std::string& token_bytes(TokenId id) const;

  // Id of the token whose vocabulary string is `token_text`: the GPT-2 byte-character form for
  // ordinary tokens ("Ġthe"), the literal content for added tokens ("<|im_end|>").
  std::optional<TokenId> token_to_id(std::string_view token_text) const;

  // Number of ids, i.e. one past the largest id (the model's embedding table may be larger).
  int32_t vocab_size() const;
  std::optional<TokenId> bos_id() const { return bos_id_; }
  std::optional<TokenId> eos_id() const { return eos_id_; }
  // Whether plain (non-chat) prompts should be encoded with add_bos = true for this model.
  // Rendered chat prompts use ChatTemplate::encode_add_bos() instead (see chat_template.h).
  bool add_bos_by_default() const { return add_bos_by_default_; }
  // True for special (control) tokens; false for ordinary tokens, non-special added tokens and
  // ids out of range.
  bool is_special(TokenId id) const;

  // Ids that end a generation: eos, tokenizer.ggml.eot_token_id, and whichever of <|im_end|>,
  // <|eot_id|>, <|end_of_text|>, </s>, <|endoftext|> are in the vocabulary. Sorted, unique.
  const std::vector<TokenId>& stop_ids() const { return stop_ids_; }

  // Jinja chat template from tokenizer.chat_template, or from tokenizer_config.json /
  // chat_template.jinja beside tokenizer.json; empty if there is none.
  const std::string& chat_template_source() const { return chat_template_source_; }

 private:
  Tokenizer();
  static StatusOr<std::unique_ptr<Tokenizer>> from_spec(detail::TokenizerSpec spec);
  // from_gguf() of tokenizer.ggml.model = "llama".
  static StatusOr<std::unique_ptr<Tokenizer>> from_gguf_sentencepiece(const model::GgufFile& file);
  std::vector<TokenId> encode_spans(std::string_view text, bool add_bos,
                                    std::span<const std::pair<uint32_t, uint32_t>> untrusted) const;
  // Appends the ids of `text` (valid UTF-8, no added tokens matched yet) to `out`.
  void encode_ordinary(std::string_view text, std::vector<TokenId>* out) const;

  std::unique_ptr<detail::BpeModel> bpe_;
  std::unique_ptr<detail::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<detail::AddedVocab> added_vocab_;
  std::unique_ptr<detail::Normalizer> normalizer_;  // tokenizer.json's normalizer; null: none
  std::unique_ptr<detail::SpmModel> spm_;           // SentencePiece models: used instead of bpe_
  std::vector<std::string> token_bytes_;  // [vocab_size], raw bytes per id
  std::vector<uint8_t> is_special_;       // [vocab_size], 1 for special (control) tokens
  std::optional<TokenId> bos_id_;
  std::optional<TokenId> eos_id_;
  bool add_bos_by_default_ = false;
  std::vector<TokenId> stop_ids_;
  std::string chat_template_source_;
};

// Incremental detokenizer for streaming one token at a time. push() returns only complete UTF-8
// text: the bytes of a UTF-8 sequence that is still incomplete are held back until a later token
// completes it, and invalid sequences become U+FFFD as soon as they are known to be invalid. The
// concatenation of every push() and the final flush() equals Tokenizer::decode() of all the ids.
// Keeps a reference to the tokenizer, which must outlive it. Not thread-safe (one per sequence).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);

  // Text completed by `id` (often empty for a partial character). Out-of-range ids are skipped.
  std::string push(TokenId id);
  // Everything still held back (incomplete sequences become U+FFFD); resets the decoder.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of at most one incomplete UTF-8 sequence (< 4 bytes)
};

}  // namespace strata::tokenizer
