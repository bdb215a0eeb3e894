#include "strata/sampling/grammar.h"

#include <algorithm>
#include <map>

#include "strata/common/check.h"

namespace strata::sampling {

// ---- TokenTable -----------------------------------------------------------------------------

TokenTable::TokenTable(std::vector<std::string> token_bytes, std::vector<TokenId> stop_ids)
    : bytes_(std::move(token_bytes)), stop_ids_(std::move(stop_ids)) {
  // Build a pointer trie, then lay it out with contiguous, byte-sorted children.
  struct Build {
    std::map<uint8_t, int32_t> children;
    std::vector<TokenId> tokens;
  };
  std::vector<Build> build(1);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (bytes_[id].empty()) continue;
    int32_t node = 0;
    for (char c : bytes_[id]) {
      const auto b = static_cast<uint8_t>(c);
      auto it = build[static_cast<size_t>(node)].children.find(b);
      if (it == build[static_cast<size_t>(node)].children.end()) {
        build.push_back({});
        it = build[static_cast<size_t>(node)]
                 .children.emplace(b, static_cast<int32_t>(build.size() - 1))
                 .first;
      }
      node = it->second;
    }
    build[static_cast<size_t>(node)].tokens.push_back(static_cast<TokenId>(id));
  }
  // Breadth-first layout: node i's children get consecutive slots.
  nodes_.resize(build.size());
  std::vector<int32_t> order = {0};  // build index of each laid-out node
  for (size_t i = 0; i < order.size(); ++i) {
    Build& b = build[static_cast<size_t>(order[i])];
    nodes_[i].tokens = std::move(b.tokens);
    nodes_[i].first_child = static_cast<int32_t>(order.size());
    nodes_[i].num_children = static_cast<int32_t>(b.children.size());
    for (const auto& [byte, child] : b.children) {
      nodes_[order.size()].byte = byte;
      order.push_back(child);
    }
  }
}

// ---- Grammar building -----------------------------------------------------------------------

int32_t Grammar::new_rule() {
  rules_.emplace_back();
  return static_cast<int32_t>(rules_.size() - 1);
}

void Grammar::add_alternative(int32_t rule, std::vector<Element> elements) {
  rules_[static_cast<size_t>(rule)].push_back(static_cast<int32_t>(elements_.size()));
  elements_.insert(elements_.end(), elements.begin(), elements.end());
  elements_.push_back({Element::Kind::kEnd, 0});
}

Grammar::Element Grammar::bytes(std::string_view set) {
  std::array<uint64_t, 4> bits{};
  for (char c : set) {
    const auto b = static_cast<uint8_t>(c);
    bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  byte_sets_.push_back(bits);
  return {Element::Kind::kBytes, static_cast<int32_t>(byte_sets_.size() - 1)};
}

Grammar::Element Grammar::byte_range(uint8_t lo, uint8_t hi) { return byte_ranges({{lo, hi}}); }

Grammar::Element Grammar::byte_ranges(std::initializer_list<std::pair<uint8_t, uint8_t>> ranges) {
  std::array<uint64_t, 4> bits{};
  for (const auto& [lo, hi] : ranges) {
    for (int b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  byte_sets_.push_back(bits);
  return {Element::Kind::kBytes, static_cast<int32_t>(byte_sets_.size() - 1)};
}

int32_t Grammar::literal(std::string_view text) {
  std::vector<Element> elements;
  for (char c : text) elements.push_back(bytes(std::string_view(&c, 1)));
  const int32_t rule = new_rule();
  add_alternative(rule, std::move(elements));
  return rule;
}

// ---- Matching -------------------------------------------------------------------------------

namespace {

// A pushdown stack, persistent: frames are shared between the stacks that branch from them.
// `pos` is the next element to match (always a byte set once normalised); `parent` the frame to
// continue with when this rule ends (null: the root's end).
struct Frame {
  int32_t pos;
  std::shared_ptr<const Frame> parent;
};
using Stack = std::shared_ptr<const Frame>;  // null: the whole grammar matched

}  // namespace

struct GrammarMatcher::State {
  std::vector<Stack> stacks;
};

namespace {

class Stepper {
 public:
  Stepper(const std::vector<Grammar::Element>& elements,
          const std::vector<std::vector<int32_t>>& rules,
          const std::vector<std::array<uint64_t, 4>>& sets)
      : elements_(elements), rules_(rules), sets_(sets) {}

  // Appends to *out the stacks that continue at element `pos` with `parent` below, expanded until
  // each stands on a byte set (or is null: complete).
  void normalise(int32_t pos, const Stack& parent, std::vector<Stack>* out) const {
    const Grammar::Element& e = elements_[static_cast<size_t>(pos)];
    switch (e.kind) {
      case Grammar::Element::Kind::kEnd:
        if (!parent) {
          out->push_back(nullptr);
        } else {
          normalise(parent->pos, parent->parent, out);
        }
        return;
      case Grammar::Element::Kind::kRule: {
        // A reference that ends its alternative continues where the alternative would: no frame
        // (tail calls), so right recursion (lists, strings) keeps the stacks short and equal.
        const bool tail =
            elements_[static_cast<size_t>(pos) + 1].kind == Grammar::Element::Kind::kEnd;
        const Stack resume = tail ? parent : std::make_shared<const Frame>(Frame{pos + 1, parent});
        for (int32_t alt : rules_[static_cast<size_t>(e.index)]) normalise(alt, resume, out);
        return;
      }
      case Grammar::Element::Kind::kBytes:
        out->push_back(std::make_shared<const Frame>(Frame{pos, parent}));
        return;
    }
  }

  // The stacks after matching `byte` from `stacks`.
  void advance(const std::vector<Stack>& stacks, uint8_t byte, std::vector<Stack>* out) const {
    out->clear();
    for (const Stack& s : stacks) {
      if (!s) continue;
      const auto& bits = sets_[static_cast<size_t>(elements_[static_cast<size_t>(s->pos)].index)];
      if ((bits[byte >> 6] >> (byte & 63)) & 1) normalise(s->pos + 1, s->parent, out);
    }
  }

 private:
  const std::vector<Grammar::Element>& elements_;
  const std::vector<std::vector<int32_t>>& rules_;
  const std::vector<std::array<uint64_t, 4>>& sets_;
};

// The stacks' content as a string of positions (top to bottom, '|' between stacks), sorted and
// unique: equal keys are equal states.
std::string state_key(const std::vector<Stack>& stacks) {
  std::vector<std::string> keys;
  for (const Stack& s : stacks) {
    std::string k;
    for (const Frame* f = s.get(); f; f = f->parent.get()) {
      k.append(reinterpret_cast<const char*>(&f->pos), sizeof(f->pos));
    }
    keys.push_back(std::move(k));
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::string out;
  for (const std::string& k : keys) out.append(k).push_back('|');
  return out;
}

// Drops stacks with the same content (keeps the first).
void dedupe(std::vector<Stack>* stacks) {
  std::vector<std::string> seen;
  std::vector<Stack> out;
  for (Stack& s : *stacks) {
    std::string key = state_key({s});
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(std::move(key));
    out.push_back(std::move(s));
  }
  stacks->swap(out);
}

constexpr size_t kMaxCachedMasks = 4096;

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), state_(std::make_unique<State>()) {
  const Grammar& g = *grammar_;
  Stepper stepper(g.elements_, g.rules_, g.byte_sets_);
  for (int32_t alt : g.rules_[static_cast<size_t>(g.root_)]) {
    stepper.normalise(alt, nullptr, &state_->stacks);
  }
  dedupe(&state_->stacks);
}

GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

bool GrammarMatcher::complete() const {
  return std::any_of(state_->stacks.begin(), state_->stacks.end(),
                     [](const Stack& s) { return s == nullptr; });
}

std::shared_ptr<const TokenMask> GrammarMatcher::allowed_tokens() const {
  const Grammar& g = *grammar_;
  const std::string key = state_key(state_->stacks);
  {
    std::lock_guard<std::mutex> lock(g.cache_mutex_);
    auto it = g.mask_cache_.find(key);
    if (it != g.mask_cache_.end()) return it->second;
  }
  const TokenTable& table = g.tokens();
  auto mask = std::make_shared<TokenMask>((static_cast<size_t>(table.vocab_size()) + 63) / 64, 0);
  auto allow = [&](TokenId id) {
    (*mask)[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  };
  Stepper stepper(g.elements_, g.rules_, g.byte_sets_);
  const std::vector<TokenTable::Node>& nodes = table.nodes();
  // Depth-first over the trie; level d holds the stacks after the first d bytes.
  std::vector<std::vector<Stack>> levels(1, state_->stacks);
  struct Item {
    int32_t node;
    int32_t depth;
  };
  std::vector<Item> todo;
  for (int32_t c = 0; c < nodes[0].num_children; ++c) todo.push_back({nodes[0].first_child + c, 0});
  while (!todo.empty()) {
    const Item item = todo.back();
    todo.pop_back();
    const TokenTable::Node& node = nodes[static_cast<size_t>(item.node)];
    if (levels.size() < static_cast<size_t>(item.depth) + 2) levels.resize(item.depth + 2);
    std::vector<Stack>& next = levels[static_cast<size_t>(item.depth) + 1];
    stepper.advance(levels[static_cast<size_t>(item.depth)], node.byte, &next);
    if (next.empty()) continue;
    for (TokenId id : node.tokens) allow(id);
    if (node.num_children == 0) continue;
    // Children are processed before this level's slot is reused: push them now and let the
    // stack order finish this subtree first.
    for (int32_t c = node.num_children - 1; c >= 0; --c) {
      todo.push_back({node.first_child + c, item.depth + 1});
    }
  }
  if (complete()) {
    for (TokenId id : table.stop_ids()) {
      if (id >= 0 && id < table.vocab_size()) allow(id);
    }
  }
  std::lock_guard<std::mutex> lock(g.cache_mutex_);
  if (g.mask_cache_.size() >= kMaxCachedMasks) g.mask_cache_.clear();
  g.mask_cache_.emplace(key, mask);
  return mask;
}

bool GrammarMatcher::accept(TokenId token) {
  const Grammar& g = *grammar_;
  const TokenTable& table = g.tokens();
  if (token < 0 || token >= table.vocab_size()) return false;
  const std::vector<TokenId>& stops = table.stop_ids();
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return complete();
  const std::string& bytes = table.bytes(token);
  if (bytes.empty()) return false;
  Stepper stepper(g.elements_, g.rules_, g.byte_sets_);
  std::vector<Stack> stacks = state_->stacks;
  std::vector<Stack> next;
  for (char c : bytes) {
    stepper.advance(stacks, static_cast<uint8_t>(c), &next);
    if (next.empty()) return false;
    dedupe(&next);
    stacks.swap(next);
  }
  state_->stacks = std::move(stacks);
  return true;
}

}  // namespace strata::sampling
