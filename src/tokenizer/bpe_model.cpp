#include "bpe_model.h"

#include <queue>

#include "byte_level.h"

namespace strata::tokenizer::detail {

StatusOr<std::unique_ptr<BpeModel>> BpeModel::create(BpeModelParams params) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->unk_id_ = params.unk_id;
  model->ignore_merges_ = params.ignore_merges;
  model->token_to_id_.reserve(params.vocab.size());
  for (auto& [text, id] : params.vocab) model->token_to_id_.emplace(std::move(text), id);
  for (int b = 0; b < 256; ++b) {
    model->byte_ids_[b] = model->find(byte_to_chars(static_cast<uint8_t>(b)));
  }
  model->merges_.reserve(params.merges.size());
  for (size_t rank = 0; rank < params.merges.size(); ++rank) {
    const auto& [left, right] = params.merges[rank];
    const auto left_id = model->find(left);
    const auto right_id = model->find(right);
    const auto merged_id = model->find(left + right);
    if (!left_id || !right_id || !merged_id) {
      return invalid_argument_error("BPE merge #" + std::to_string(rank) + " '" + left + " " +
                                    right + "' names a token that is not in the vocabulary");
    }
    // A repeated pair keeps its first (best) rank, as in HF.
    model->merges_.emplace(pair_key(*left_id, *right_id),
                           Merge{static_cast<int32_t>(rank), *merged_id});
  }
  return model;
}

std::optional<TokenId> BpeModel::find(std::string_view token_text) const {
  const auto it = token_to_id_.find(token_text);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<TokenId>* out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    if (const auto id = find(byte_level_encode(bytes))) {
      out->push_back(*id);
      return;
    }
  }
  // Symbols form a doubly linked list over the piece; a merged-away symbol has id -1.
  struct Symbol {
    TokenId id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  for (char c : bytes) {
    const auto id = byte_ids_[static_cast<uint8_t>(c)];
    if (!id && !unk_id_) continue;  // HF drops characters it cannot represent
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id ? *id : *unk_id_, index - 1, index + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Candidate merges ordered by rank, then position (leftmost first), as HF's word.merge_all().
  struct Candidate {
    int32_t rank;
    int32_t pos;  // index of the left symbol
    TokenId merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_candidate = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push(Candidate{it->second.rank, left, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_candidate(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale if either side changed since the candidate was queued.
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    push_candidate(left.prev);
    push_candidate(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

}  // namespace strata::tokenizer::detail
