#include "spm_model.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <queue>

namespace strata::tokenizer::detail {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

size_t utf8_length(uint8_t first) {
  if (first < 0x80) return 1;
  if ((first & 0xE0) == 0xC0) return 2;
  if ((first & 0xF0) == 0xE0) return 3;
  if ((first & 0xF8) == 0xF0) return 4;
  return 1;
}

// "<0xAB>" -> 0xAB; nullopt for anything else.
std::optional<uint8_t> byte_of_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return std::nullopt;
  unsigned value = 0;
  if (std::sscanf(std::string(piece.substr(3, 2)).c_str(), "%2x", &value) != 1) return std::nullopt;
  return static_cast<uint8_t>(value);
}

}  // namespace

StatusOr<std::unique_ptr<SpmModel>> SpmModel::create(SpmModelParams params) {
  const size_t n = params.pieces.size();
  if (params.scores.size() != n || params.is_byte.size() != n || params.is_normal.size() != n) {
    return invalid_argument_error("SentencePiece vocabulary arrays differ in size");
  }
  std::unique_ptr<SpmModel> m(new SpmModel());
  m->kind_ = params.kind;
  m->scores_ = std::move(params.scores);
  m->unk_id_ = params.unk_id;
  float lowest = 0;
  m->add_space_prefix_ = params.add_space_prefix;
  for (size_t id = 0; id < n; ++id) {
    const auto token = static_cast<TokenId>(id);
    if (params.is_byte[id]) {
      if (std::optional<uint8_t> b = byte_of_piece(params.pieces[id])) m->byte_ids_[*b] = token;
    } else if (params.is_normal[id]) {
      m->piece_to_id_.emplace(params.pieces[id], token);  // the first id of a piece wins
      m->max_piece_bytes_ = std::max(m->max_piece_bytes_, params.pieces[id].size());
      lowest = std::min(lowest, m->scores_[id]);
    }
  }
  m->unknown_score_ = lowest - 10.0f;
  return m;
}

std::string SpmModel::piece_bytes(std::string_view piece, bool is_byte) {
  if (is_byte) {
    if (std::optional<uint8_t> b = byte_of_piece(piece))
      return std::string(1, static_cast<char>(*b));
  }
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.substr(i, kSpace.size()) == kSpace) {
      out.push_back(' ');
      i += kSpace.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

std::optional<TokenId> SpmModel::find(std::string_view piece) const {
  auto it = piece_to_id_.find(std::string(piece));
  if (it == piece_to_id_.end()) return std::nullopt;
  return it->second;
}

void SpmModel::encode(std::string_view text, bool prefix_space, std::vector<TokenId>* out) const {
  std::string escaped;
  if (add_space_prefix_ && prefix_space) escaped.append(kSpace);
  for (char c : text) {
    if (c == ' ') {
      escaped.append(kSpace);
    } else {
      escaped.push_back(c);
    }
  }
  if (escaped.empty()) return;
  if (kind_ == SpmModelParams::Kind::kUnigram) {
    encode_unigram(escaped, out);
  } else {
    encode_bpe(escaped, out);
  }
}

void SpmModel::fallback(std::string_view piece, std::vector<TokenId>* out) const {
  for (char c : piece) {
    if (const std::optional<TokenId>& id = byte_ids_[static_cast<uint8_t>(c)]) {
      out->push_back(*id);
    } else if (unk_id_) {
      out->push_back(*unk_id_);
      return;  // one unknown token per character, as SentencePiece
    }
  }
}

void SpmModel::encode_unigram(const std::string& escaped, std::vector<TokenId>* out) const {
  // best[i]: the best score of a segmentation of escaped[0, i), from[i] its last piece's start
  // and id (-1: an uncovered character), over character boundaries.
  const size_t n = escaped.size();
  std::vector<double> best(n + 1, -std::numeric_limits<double>::infinity());
  std::vector<size_t> from(n + 1, 0);
  std::vector<TokenId> piece(n + 1, -1);
  best[0] = 0;
  for (size_t start = 0; start < n;) {
    const size_t char_len = std::min(utf8_length(static_cast<uint8_t>(escaped[start])), n - start);
    if (best[start] == -std::numeric_limits<double>::infinity()) {
      start += char_len;
      continue;
    }
    bool single_char_piece = false;
    for (size_t len = 1; len <= max_piece_bytes_ && start + len <= n; ++len) {
      auto it = piece_to_id_.find(escaped.substr(start, len));
      if (it == piece_to_id_.end()) continue;
      single_char_piece |= len == char_len;
      const double score = best[start] + scores_[static_cast<size_t>(it->second)];
      if (score > best[start + len]) {
        best[start + len] = score;
        from[start + len] = start;
        piece[start + len] = it->second;
      }
    }
    if (!single_char_piece) {
      const double score = best[start] + unknown_score_;
      if (score > best[start + char_len]) {
        best[start + char_len] = score;
        from[start + char_len] = start;
        piece[start + char_len] = -1;
      }
    }
    start += char_len;
  }
  std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) back to front
  for (size_t end = n; end > 0; end = from[end]) spans.emplace_back(from[end], end);
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
    if (piece[it->second] >= 0) {
      out->push_back(piece[it->second]);
    } else {
      fallback(std::string_view(escaped).substr(it->first, it->second - it->first), out);
    }
  }
}

void SpmModel::encode_bpe(const std::string& escaped, std::vector<TokenId>* out) const {
  // Symbols: one per character, linked; merged in place.
  struct Symbol {
    size_t begin, length;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  for (size_t i = 0; i < escaped.size();) {
    const size_t len = std::min(utf8_length(static_cast<uint8_t>(escaped[i])), escaped.size() - i);
    symbols.push_back(
        {i, len, static_cast<int>(symbols.size()) - 1, static_cast<int>(symbols.size()) + 1});
    i += len;
  }
  symbols.back().next = -1;
  struct Bigram {
    int left, right;
    float score;
    size_t length;                           // of the merged text, to notice a stale entry
    bool operator<(const Bigram& o) const {  // the queue's top: best score, then leftmost
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::priority_queue<Bigram> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t length = symbols[left].length + symbols[right].length;
    auto it = piece_to_id_.find(escaped.substr(symbols[left].begin, length));
    if (it == piece_to_id_.end()) return;
    queue.push({left, right, scores_[static_cast<size_t>(it->second)], length});
  };
  for (size_t i = 1; i < symbols.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != b.length ||
        left.next != b.right) {
      continue;  // one side was merged since
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece(escaped.data() + symbols[i].begin, symbols[i].length);
    if (auto it = piece_to_id_.find(std::string(piece)); it != piece_to_id_.end()) {
      out->push_back(it->second);
      continue;
    }
    fallback(piece, out);
  }
}

}  // namespace strata::tokenizer::detail
