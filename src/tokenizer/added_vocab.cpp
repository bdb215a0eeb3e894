#include "added_vocab.h"

#include <algorithm>

#include "utf8.h"

namespace strata::tokenizer::detail {
namespace {

// Start of the code point that ends just before `pos` in valid UTF-8 `text`. REQUIRES: pos > 0.
size_t previous_code_point(std::string_view text, size_t pos) {
  do {
    --pos;
  } while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80);
  return pos;
}

}  // namespace

void AddedVocab::Trie::insert(std::string_view content, int32_t token) {
  int32_t node = 0;
  for (char c : content) {
    const auto byte = static_cast<uint8_t>(c);
    auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0}),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it != children.end() && it->first == byte) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes.size());
      children.insert(it, {byte, child});
      nodes.emplace_back();  // invalidates `children`; not used below
      node = child;
    }
  }
  // The first of two tokens with the same content wins.
  if (nodes[node].token < 0) nodes[node].token = token;
}

std::pair<size_t, int32_t> AddedVocab::Trie::longest_match(std::string_view text,
                                                           size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    const auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0}),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it == children.end() || it->first != byte) break;
    node = it->second;
    if (nodes[node].token >= 0) best = {i + 1 - pos, nodes[node].token};
  }
  return best;
}

AddedVocab::AddedVocab(const std::vector<AddedTokenSpec>& tokens) : tokens_(tokens) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedTokenSpec& token = tokens_[i];
    content_to_id_.emplace(token.content, token.id);
    if (token.content.empty() || !is_valid_utf8(token.content)) continue;
    (token.normalized ? normalized_ : non_normalized_)
        .insert(token.content, static_cast<int32_t>(i));
  }
}

std::optional<TokenId> AddedVocab::find(std::string_view content) const {
  const auto it = content_to_id_.find(std::string(content));
  if (it == content_to_id_.end()) return std::nullopt;
  return it->second;
}

void AddedVocab::split(std::string_view text,
                       std::span<const std::pair<uint32_t, uint32_t>> untrusted,
                       const Normalizer* normalizer, std::deque<std::string>* storage,
                       std::vector<Segment>* segments) const {
  segments->clear();
  if (text.empty()) return;
  segments->push_back(Segment{text, std::nullopt});
  split_pass(non_normalized_, text, untrusted, segments);
  if (normalizer == nullptr) {
    split_pass(normalized_, text, untrusted, segments);
    return;
  }
  std::vector<Segment> out;
  for (const Segment& segment : *segments) {
    if (segment.id) {
      out.push_back(segment);
      continue;
    }
    const auto begin = static_cast<size_t>(segment.text.data() - text.data());
    const size_t end = begin + segment.text.size();
    const bool tainted = std::any_of(untrusted.begin(), untrusted.end(), [&](const auto& span) {
      return span.first < end && span.second > begin;
    });
    storage->push_back(normalizer->normalize(segment.text));
    const std::string& normalized = storage->back();
    if (normalized.empty()) continue;
    std::vector<Segment> parts = {Segment{normalized, std::nullopt}};
    const std::pair<uint32_t, uint32_t> whole{0, static_cast<uint32_t>(normalized.size())};
    split_pass(normalized_, normalized,
               tainted ? std::span<const std::pair<uint32_t, uint32_t>>(&whole, 1)
                       : std::span<const std::pair<uint32_t, uint32_t>>(),
               &parts);
    out.insert(out.end(), parts.begin(), parts.end());
  }
  segments->swap(out);
}

void AddedVocab::split_pass(const Trie& trie, std::string_view whole,
                            std::span<const std::pair<uint32_t, uint32_t>> untrusted,
                            std::vector<Segment>* segments) const {
  // Whether [begin, end) of `whole` overlaps an untrusted range.
  auto overlaps_untrusted = [&](size_t begin, size_t end) {
    for (const auto& [b, e] : untrusted) {
      if (b >= end) break;
      if (e > begin) return true;
    }
    return false;
  };
  if (trie.nodes.size() == 1) return;  // no tokens in this pass
  std::vector<Segment> out;
  out.reserve(segments->size());
  for (const Segment& segment : *segments) {
    if (segment.id) {
      out.push_back(segment);
      continue;
    }
    const std::string_view text = segment.text;
    size_t text_begin = 0;  // start of the text not yet emitted
    size_t pos = 0;
    while (pos < text.size()) {
      const auto [length, index] = trie.longest_match(text, pos);
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedTokenSpec& token = tokens_[index];
      const auto offset = static_cast<size_t>(text.data() - whole.data());
      if (token.special && overlaps_untrusted(offset + pos, offset + pos + length)) {
        ++pos;
        continue;
      }
      size_t begin = pos;
      size_t end = pos + length;
      size_t len = 0;
      if (token.lstrip) {
        while (begin > text_begin) {
          const size_t prev = previous_code_point(text, begin);
          if (!is_unicode_whitespace(decode_code_point(text, prev, &len))) break;
          begin = prev;
        }
      }
      if (token.rstrip) {
        while (end < text.size() && is_unicode_whitespace(decode_code_point(text, end, &len))) {
          end += len;
        }
      }
      if (begin > text_begin)
        out.push_back(Segment{text.substr(text_begin, begin - text_begin), {}});
      out.push_back(Segment{text.substr(begin, end - begin), token.id});
      text_begin = pos = end;
    }
    if (text_begin < text.size()) out.push_back(Segment{text.substr(text_begin), std::nullopt});
  }
  segments->swap(out);
}

}  // namespace strata::tokenizer::detail
