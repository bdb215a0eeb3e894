// Added tokens (special and user-defined) matched in raw text before pre-tokenization, with the
// semantics of HF's AddedVocabulary: leftmost-longest matches, tokens with normalized = false
// first, then normalized ones in the remaining spans, lstrip/rstrip swallowing white space.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "normalizer.h"
#include "strata/common/status.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::tokenizer::detail {

struct AddedTokenSpec {
  TokenId id = 0;
  std::string content;   // literal text as it appears in input
  bool special = false;  // skipped by decode(skip_special = true)
  bool lstrip = false;   // the match also takes the white space before it
  bool rstrip = false;   // ... and after it
  bool normalized = false;
};

// Immutable after construction; split() is const and thread-safe.
class AddedVocab {
 public:
  // Tokens whose content is empty or not valid UTF-8 are never matched (they cannot occur in
  // valid text as a whole), but still answer find().
  explicit AddedVocab(const std::vector<AddedTokenSpec>& tokens);

  struct Segment {
    std::string_view text;      // view into the input
    std::optional<TokenId> id;  // set if `text` is (a match of) an added token
  };
  // Replaces *segments with the segments of `text` in order. Text segments are non-empty.
  // Special tokens are not matched where they would overlap a byte range of `untrusted`
  // ([begin, end) offsets into `text`, sorted). With a `normalizer`, the text between the
  // unnormalized matches is normalized (into *storage, which the segments then view; a deque, so
  // views stay valid) before the normalized tokens are matched in it, as HF does; there a special
  // token is not matched in a segment that holds any untrusted byte.
  void split(std::string_view text, std::span<const std::pair<uint32_t, uint32_t>> untrusted,
             const Normalizer* normalizer, std::deque<std::string>* storage,
             std::vector<Segment>* segments) const;

  std::optional<TokenId> find(std::string_view content) const;

 private:
  // Byte trie over the contents of one matching pass.
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
      int32_t token = -1;  // index into tokens_ of the token ending here, or -1
    };
    std::vector<Node> nodes{Node{}};  // nodes[0] is the root
    void insert(std::string_view content, int32_t token);
    // Length of the longest token starting at text[pos] and its index, or {0, -1}.
    std::pair<size_t, int32_t> longest_match(std::string_view text, size_t pos) const;
  };
  // Splits text segments of *segments (in place) by the tokens in `trie`.
  void split_pass(const Trie& trie, std::string_view text,
                  std::span<const std::pair<uint32_t, uint32_t>> untrusted,
                  std::vector<Segment>* segments) const;

  std::vector<AddedTokenSpec> tokens_;
  Trie non_normalized_;  // first pass
  Trie normalized_;      // second pass
  std::unordered_map<std::string, TokenId> content_to_id_;
};

}  // namespace strata::tokenizer::detail
