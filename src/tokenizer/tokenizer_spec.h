// Everything a Tokenizer is built from, filled in by the GGUF and tokenizer.json loaders.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "added_vocab.h"
#include "bpe_model.h"
#include "normalizer.h"
#include "spm_model.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::tokenizer::detail {

struct TokenizerSpec {
  std::string source;  // file the spec came from, for error messages
  BpeModelParams bpe;  // byte-level BPE (when spm is unset)
  std::optional<SpmModelParams> spm;  // SentencePiece BPE instead (GGUF model "llama")
  std::vector<AddedTokenSpec> added_tokens;
  std::vector<NormalizationForm> normalization;     // tokenizer.json's normalizer, in order
  std::vector<std::string> pre_tokenizer_patterns;  // applied in order, Isolated behaviour
  std::optional<TokenId> bos_id;
  std::optional<TokenId> eos_id;
  std::vector<TokenId> extra_stop_ids;  // e.g. tokenizer.ggml.eot_token_id
  bool add_bos_by_default = false;
  std::string chat_template;
};

// The regex of HF's ByteLevel pre-tokenizer (use_regex = true), i.e. GPT-2's.
inline constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace strata::tokenizer::detail
