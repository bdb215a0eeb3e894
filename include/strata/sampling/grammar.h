// Constrained decoding (structured outputs): a byte-level context-free grammar, the vocabulary as
// bytes, and a per-sequence matcher that says which tokens may come next.
//
//   TokenTable     the vocabulary's bytes in a trie, and the stop ids (built once per tokenizer)
//   Grammar        rules over bytes, compiled from a JSON Schema (OpenAI's response_format
//                  json_schema / json_object, named tool calls); immutable, shared by requests
//   GrammarMatcher one sequence's position in the grammar: the token mask for the next step, and
//                  accept() of the token drawn
//
// The matcher keeps the set of pushdown stacks the bytes so far allow (the grammars we compile
// are not ambiguous, so there are few). A token is allowed when its bytes, fed one by one from
// the current stacks, leave at least one alive; the mask is computed by walking the vocabulary
// trie with the stacks, pruning a subtree at the first byte that kills them all, and is cached
// in the Grammar by the stacks' content (inside a JSON string, or between the keys of an object
// already seen, the same stacks come back and the mask costs a lookup). Stop tokens are allowed
// exactly when the bytes so far are a complete match; when nothing else is, they are the only
// choice. Tokens whose bytes are empty (control tokens) are never allowed.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "strata/common/ids.h"
#include "strata/common/status.h"

namespace strata::sampling {

class TokenTable {
 public:
  // token_bytes[id] is the raw bytes of token id (empty for control tokens); stop_ids end a
  // generation.
  TokenTable(std::vector<std::string> token_bytes, std::vector<TokenId> stop_ids);

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(TokenId id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<TokenId>& stop_ids() const { return stop_ids_; }

  // Byte trie over every non-empty token: nodes_[0] is the root.
  struct Node {
    int32_t first_child = -1;  // children are contiguous, sorted by byte
    int32_t num_children = 0;
    uint8_t byte = 0;
    std::vector<TokenId> tokens;  // tokens whose bytes end here
  };
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<TokenId> stop_ids_;
  std::vector<Node> nodes_;
};

// A set of allowed token ids as a bit mask: bit (id % 64) of word id / 64.
using TokenMask = std::vector<uint64_t>;
inline bool mask_allows(const TokenMask& mask, TokenId id) {
  return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
}

class Grammar {
 public:
  // One element of a rule's alternative: a byte set, a reference to a rule, or the end.
  struct Element {
    enum class Kind : uint8_t { kBytes, kRule, kEnd };
    Kind kind = Kind::kEnd;
    int32_t index = 0;  // kBytes: into byte_sets_; kRule: the rule
  };

  // OpenAI's strict json_schema response format: `schema` (JSON text) as a grammar over the
  // bytes of compact-ish JSON (at most one space after ':' and ','). Supported: type (one or a
  // list), properties / required / additionalProperties, items / prefixItems / minItems /
  // maxItems, enum, const, anyOf / oneOf / allOf of one, $ref to #/$defs or #/definitions,
  // minLength / maxLength; description, title, default and format are ignored. Anything else
  // (pattern, minimum, ...) is INVALID_ARGUMENT naming the keyword, rather than unenforced.
  static StatusOr<std::shared_ptr<const Grammar>> from_json_schema(
      std::string_view schema_json, std::shared_ptr<const TokenTable> tokens);
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const Grammar> any_json_object(std::shared_ptr<const TokenTable> tokens);
  // `prefix`, then a value of `schema_json`, then `suffix`: a named tool call in a model's own
  // markup (e.g. "<tool_call>\n{\"name\": \"f\", \"arguments\": " ... "}\n</tool_call>").
  static StatusOr<std::shared_ptr<const Grammar>> wrapped_json_schema(
      std::string_view prefix, std::string_view schema_json, std::string_view suffix,
      std::shared_ptr<const TokenTable> tokens);

  const TokenTable& tokens() const { return *tokens_; }

  // Builder interface, used by the compilers in grammar_json.cpp.
  Grammar(std::shared_ptr<const TokenTable> tokens) : tokens_(std::move(tokens)) {}
  int32_t new_rule();
  void add_alternative(int32_t rule, std::vector<Element> elements);
  Element bytes(std::string_view set);         // any of these bytes
  Element byte_range(uint8_t lo, uint8_t hi);  // lo..hi inclusive
  // Any byte in one of the inclusive ranges.
  Element byte_ranges(std::initializer_list<std::pair<uint8_t, uint8_t>> ranges);
  Element ref(int32_t rule) const { return {Element::Kind::kRule, rule}; }
  int32_t literal(std::string_view text);  // a rule matching exactly `text`
  void set_root(int32_t rule) { root_ = rule; }

 private:
  friend class GrammarMatcher;
  std::shared_ptr<const TokenTable> tokens_;
  // rules_[r] = alternatives, each a span of elements_ ending with kEnd.
  std::vector<std::vector<int32_t>> rules_;  // alternative start offsets into elements_
  std::vector<Element> elements_;
  std::vector<std::array<uint64_t, 4>> byte_sets_;
  int32_t root_ = 0;
  // Masks by matcher state (see GrammarMatcher::state_key), shared by every sequence.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenMask>> mask_cache_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  // The tokens allowed next, over TokenTable::vocab_size() ids.
  std::shared_ptr<const TokenMask> allowed_tokens() const;
  // Advances over `token`; false (and no change) if it is not allowed.
  bool accept(TokenId token);
  // The bytes so far form a complete match.
  bool complete() const;

 private:
  struct State;
  std::shared_ptr<const Grammar> grammar_;
  std::unique_ptr<State> state_;
};

}  // namespace strata::sampling
