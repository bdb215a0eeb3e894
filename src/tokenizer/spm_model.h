// SentencePiece models: spaces become U+2581 ("▁") and a "▁" is prepended to the text
// (add_space_prefix), then
//   kBpe      (GGUF tokenizer.ggml.model = "llama": Llama 1/2, Mistral; tokenizer.json BPE with
//             byte_fallback) as SentencePiece's bpe_model and llama.cpp's llm_tokenizer_spm: the
//             adjacent symbols whose concatenation is the best-scoring piece merge first
//             (leftmost on ties);
//   kUnigram  (tokenizer.json Unigram) as SentencePiece's unigram_model and HF's Unigram: the
//             segmentation with the highest total score (Viterbi), an uncovered character
//             scoring the lowest piece score minus 10;
// and a character no piece covers becomes its UTF-8 bytes' <0xXX> tokens (byte fallback), or
// the unknown token.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "strata/common/status.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::tokenizer::detail {

struct SpmModelParams {
  enum class Kind { kBpe, kUnigram } kind = Kind::kBpe;
  std::vector<std::string> pieces;  // by id; "▁" for spaces, "<0xXX>" for byte tokens
  std::vector<float> scores;        // by id; higher merges first
  std::vector<bool> is_byte;        // by id: a byte-fallback token
  std::vector<bool> is_normal;      // by id: a piece encoding may produce (not control/unused)
  std::optional<TokenId> unk_id;
  bool add_space_prefix = true;
};

// Immutable after create(); encode() is const and thread-safe.
class SpmModel {
 public:
  // INVALID_ARGUMENT for mismatched array sizes.
  static StatusOr<std::unique_ptr<SpmModel>> create(SpmModelParams params);

  // Appends the ids of `text` (valid UTF-8), with the "▁" prefix when `prefix_space` (the text
  // starts the input or follows an added token, as llama.cpp and HF's Prepend normalizer do).
  void encode(std::string_view text, bool prefix_space, std::vector<TokenId>* out) const;

  // The bytes a piece stands for: "▁" as a space, a byte token as its byte.
  static std::string piece_bytes(std::string_view piece, bool is_byte);
  std::optional<TokenId> find(std::string_view piece) const;

 private:
  SpmModel() = default;
  void encode_bpe(const std::string& escaped, std::vector<TokenId>* out) const;
  void encode_unigram(const std::string& escaped, std::vector<TokenId>* out) const;
  // The ids of a piece no vocabulary piece covers: its bytes' tokens, or one unknown token.
  void fallback(std::string_view piece, std::vector<TokenId>* out) const;

  SpmModelParams::Kind kind_ = SpmModelParams::Kind::kBpe;
  std::unordered_map<std::string, TokenId> piece_to_id_;  // normal pieces only
  std::vector<float> scores_;
  size_t max_piece_bytes_ = 0;
  float unknown_score_ = 0;  // kUnigram: the lowest score minus 10
  std::array<std::optional<TokenId>, 256> byte_ids_;
  std::optional<TokenId> unk_id_;
  bool add_space_prefix_ = true;
};

}  // namespace strata::tokenizer::detail
