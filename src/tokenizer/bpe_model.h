// Byte-level BPE model: vocabulary of byte-character strings and ranked merges (HF models::BPE
// with byte_level pre-processing, without dropout, subword prefixes/suffixes or byte fallback).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/common/status.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::tokenizer::detail {

struct BpeModelParams {
  std::vector<std::pair<std::string, TokenId>> vocab;       // byte-character form -> id
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, best first
  std::optional<TokenId> unk_id;  // used for bytes without a single-byte token; else they drop
  bool ignore_merges = false;     // a piece that is itself in the vocabulary is one token
};

// Immutable after create(); encode_piece() is const and thread-safe.
class BpeModel {
 public:
  // INVALID_ARGUMENT naming the merge if one of its sides, or their concatenation, is not in
  // the vocabulary (HF refuses such a model too).
  static StatusOr<std::unique_ptr<BpeModel>> create(BpeModelParams params);

  // Appends the ids of one pre-token given as raw bytes.
  void encode_piece(std::string_view bytes, std::vector<TokenId>* out) const;

  std::optional<TokenId> find(std::string_view token_text) const;

 private:
  struct Merge {
    int32_t rank;
    TokenId merged_id;
  };
  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  BpeModel() = default;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;        // pair_key(left, right) -> merge
  std::array<std::optional<TokenId>, 256> byte_ids_;  // id of each single-byte token
  std::optional<TokenId> unk_id_;
  bool ignore_merges_ = false;
};

}  // namespace strata::tokenizer::detail
