// The executor's checks of a batch before anything is written (torch_executor.h: validate()).

#include <algorithm>
#include <string>
#include <unordered_set>

#include "torch_executor.h"

namespace strata::executor {

Status TorchExecutor::validate(const ForwardBatch& batch) const {
  std::unordered_set<SeqId> seen;
  const int64_t block = kv_geometry_.block_size_tokens;
  for (const SequenceChunk& chunk : batch.chunks) {
    const std::string seq = "sequence " + std::to_string(chunk.seq.value);
    if (!seen.insert(chunk.seq).second) return invalid_argument_error(seq + " appears twice");
    if (chunk.tokens.empty()) return invalid_argument_error(seq + ": empty chunk");
    for (TokenId t : chunk.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return invalid_argument_error(seq + ": token id " + std::to_string(t) +
                                      " is outside the vocabulary [0, " +
                                      std::to_string(config_.vocab_size) + ")");
      }
    }
    const int64_t end = chunk.start_position + static_cast<int64_t>(chunk.tokens.size());
    if (chunk.start_position < 0 || end > config_.max_context_tokens) {
      return invalid_argument_error(seq + ": " + std::to_string(end) +
                                    " tokens exceed the context window of " +
                                    std::to_string(config_.max_context_tokens));
    }
    if (chunk.observe_attention &&
        (decodes_from_pages(chunk) || (chunk.layout && !chunk.layout->is_default()))) {
      return invalid_argument_error(seq + ": attention is observed only on the pool's base pages");
    }
    if (chunk.observe_row_stride < 1) {
      return invalid_argument_error(seq + ": observe_row_stride must be at least 1");
    }
    STRATA_RETURN_IF_ERROR(validate_restore(batch, chunk));
    if (decodes_from_pages(chunk)) continue;  // reads and writes no pool block
    STRATA_RETURN_IF_ERROR(validate_formats(chunk));
    const int64_t num_tables = config_.num_layers * groups_of(chunk);
    if (std::ssize(chunk.tables) != num_tables) {
      return invalid_argument_error(seq + ": " + std::to_string(chunk.tables.size()) +
                                    " page tables for " + std::to_string(config_.num_layers) +
                                    " layers of " + std::to_string(groups_of(chunk)) +
                                    " KV head group(s)");
    }
    const int64_t needed_blocks = (end + block - 1) / block;
    for (int64_t t = 0; t < num_tables; ++t) {
      const std::vector<kv::BlockId>& table = chunk.tables[t];
      if (static_cast<int64_t>(table.size()) < needed_blocks) {
        return invalid_argument_error(seq + ": page tables do not cover position " +
                                      std::to_string(end - 1));
      }
      for (int64_t j = 0; j < needed_blocks; ++j) {
        if (!pool_.is_valid(table[j], format_of(chunk, t), heads_of(chunk), pool_.num_pages())) {
          return invalid_argument_error(seq + ": block " + std::to_string(table[j].value) +
                                        " is outside the pool");
        }
      }
    }
    STRATA_RETURN_IF_ERROR(validate_sharing(chunk, needed_blocks));
  }
  for (const KvLoad& load : batch.loads) {
    const std::string seq = "sequence " + std::to_string(load.seq.value);
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == load.seq; });
    if (chunk == batch.chunks.end()) return invalid_argument_error(seq + ": load without a chunk");
    if (chunk->layout && !chunk->layout->is_default()) {
      return invalid_argument_error(seq + ": loads need the default KV layout");
    }
    const int64_t end_block = load.first_block + static_cast<int64_t>(load.chunks.size());
    const int64_t below = chunk->start_position + chunk->restored_tokens;
    if (load.first_block < 0 || end_block * block > below) {
      return invalid_argument_error(seq + ": loaded blocks must lie below position " +
                                    std::to_string(below));
    }
    if (load.arrivals && (load.encoding || !streams_loads())) {
      return invalid_argument_error(seq + ": streamed loads need raw chunks and a CPU executor");
    }
    if (!load.arrivals &&
        std::find(load.chunks.begin(), load.chunks.end(), nullptr) != load.chunks.end()) {
      return invalid_argument_error(seq + ": null load source");
    }
  }
  for (const KvSave& save : batch.saves) {
    const std::string seq = "sequence " + std::to_string(save.seq.value);
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == save.seq; });
    if (chunk == batch.chunks.end()) return invalid_argument_error(seq + ": save without a chunk");
    if (chunk->layout && !chunk->layout->is_default()) {
      return invalid_argument_error(seq + ": saves need the default KV layout");
    }
    const int64_t end = chunk->start_position + static_cast<int64_t>(chunk->tokens.size());
    const int64_t end_block = save.first_block + static_cast<int64_t>(save.chunks.size());
    if (save.first_block < 0 || end_block * block > end) {
      return invalid_argument_error(seq + ": saved blocks must end by position " +
                                    std::to_string(end));
    }
    if (std::find(save.chunks.begin(), save.chunks.end(), nullptr) != save.chunks.end()) {
      return invalid_argument_error(seq + ": null save destination");
    }
  }
  for (const KvPreload& p : batch.preloads) {
    const std::string seq = "sequence " + std::to_string(p.seq.value);
    if (std::any_of(batch.chunks.begin(), batch.chunks.end(),
                    [&](const SequenceChunk& c) { return c.seq == p.seq; })) {
      return invalid_argument_error(seq + ": pre-load for a sequence of the same pass");
    }
    if (p.num_layers < 1 || p.num_layers > config_.num_layers || p.chunks.empty() ||
        std::find(p.chunks.begin(), p.chunks.end(), nullptr) != p.chunks.end()) {
      return invalid_argument_error(seq + ": pre-load needs chunks and 1.." +
                                    std::to_string(config_.num_layers) + " layers");
    }
  }
  // Each copy's source and destination must lie in their pools (device or host).
  auto check = [&](const std::vector<kv::BlockCopy>& copies, int64_t source_pages,
                   int64_t destination_pages, const char* what) -> Status {
    for (const kv::BlockCopy& c : copies) {
      if (!pool_.is_valid(c.source, c.format, c.heads, source_pages) ||
          !pool_.is_valid(c.destination, c.format, c.heads, destination_pages)) {
        return invalid_argument_error(std::string(what) + " " + std::to_string(c.source.value) +
                                      " -> " + std::to_string(c.destination.value) +
                                      " is outside the pools");
      }
    }
    return Status();
  };
  const int64_t device_pages = pool_.num_pages();
  const int64_t host_pages = pool_.num_host_pages();
  STRATA_RETURN_IF_ERROR(check(batch.copies.swap_out, device_pages, host_pages, "swap-out"));
  STRATA_RETURN_IF_ERROR(check(batch.copies.swap_in, host_pages, device_pages, "swap-in"));
  STRATA_RETURN_IF_ERROR(check(batch.copies.device, device_pages, device_pages, "block copy"));
  return Status();
}

Status TorchExecutor::validate_formats(const SequenceChunk& chunk) const {
  if (chunk.layout == nullptr) return Status();
  const kv::KvLayout& layout = *chunk.layout;
  const std::string seq = "sequence " + std::to_string(chunk.seq.value);
  const int64_t layers = config_.num_layers;
  const int32_t groups = layout.head_groups;
  if (groups < 1 || config_.num_kv_heads % groups != 0) {
    return invalid_argument_error(seq + ": " + std::to_string(groups) + " KV head groups of " +
                                  std::to_string(config_.num_kv_heads) + " heads");
  }
  if ((!layout.formats.empty() && std::ssize(layout.formats) != layers * groups) ||
      (!layout.shared_with.empty() && std::ssize(layout.shared_with) != layers)) {
    return invalid_argument_error(seq +
                                  ": a KV layout needs one format per page table and one "
                                  "sharing entry per layer");
  }
  for (int64_t t = 0; t < layers * groups; ++t) {
    if (!pool_.layout().holds(format_of(chunk, t), heads_of(chunk))) {
      return invalid_argument_error(seq + ": layer " + std::to_string(t / groups) +
                                    "'s KV format " + kv::format_name(format_of(chunk, t)) +
                                    " is not in the pool");
    }
  }
  return Status();
}

Status TorchExecutor::validate_sharing(const SequenceChunk& chunk, int64_t needed_blocks) const {
  if (chunk.layout == nullptr) return Status();
  const std::vector<int32_t>& shared_with = chunk.layout->shared_with;
  const int32_t groups = groups_of(chunk);
  for (int32_t l = 0; l < std::ssize(shared_with); ++l) {
    const int32_t owner = shared_with[l];
    if (owner < 0) continue;
    bool same = owner < l;
    for (int32_t g = 0; g < groups && same; ++g) {
      const std::vector<kv::BlockId>& mine = chunk.tables[l * groups + g];
      const std::vector<kv::BlockId>& theirs = chunk.tables[owner * groups + g];
      same = std::equal(mine.begin(), mine.begin() + needed_blocks, theirs.begin(),
                        theirs.begin() + needed_blocks);
    }
    if (!same) {
      return invalid_argument_error("sequence " + std::to_string(chunk.seq.value) + ": layer " +
                                    std::to_string(l) +
                                    " shares blocks but its page table is "
                                    "not layer " +
                                    std::to_string(owner) + "'s");
    }
  }
  return Status();
}

Status TorchExecutor::validate_restore(const ForwardBatch& batch,
                                       const SequenceChunk& chunk) const {
  const int64_t history = chunk.restored_tokens;
  if (history == 0 && chunk.computed_rows.empty()) return Status();
  const std::string seq = "sequence " + std::to_string(chunk.seq.value) + ": restoring: ";
  const int64_t block = kv_geometry_.block_size_tokens;
  if (history < 0 || history >= std::ssize(chunk.tokens)) {
    return invalid_argument_error(seq + "the history must leave at least one new token");
  }
  if (chunk.start_position % block != 0 || history % block != 0) {
    return invalid_argument_error(seq + "the chunk's start and history must be whole blocks");
  }
  if (std::ssize(chunk.computed_rows) != config_.num_layers) {
    return invalid_argument_error(seq + "one computed_rows entry per layer");
  }
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const int64_t n = chunk.computed_rows[l];
    if (n < 0 || n > history || n % block != 0 || (l > 0 && n > chunk.computed_rows[l - 1])) {
      return invalid_argument_error(seq + "layer " + std::to_string(l) + " computes " +
                                    std::to_string(n) +
                                    " rows: whole blocks of the history, never more than the "
                                    "layer above");
    }
  }
  if (chunk.logits == LogitsMode::kAll || chunk.observe_attention || decodes_from_pages(chunk) ||
      (chunk.layout && !chunk.layout->is_default()) || leankv_) {
    return invalid_argument_error(seq +
                                  "needs the default KV layout, logits of the new tokens only, "
                                  "no attention observation or LeanKV");
  }
  // Every history block some layer does not compute comes from a load.
  std::vector<bool> loaded(static_cast<size_t>(history / block), false);
  const int64_t first = chunk.start_position / block;
  for (const KvLoad& load : batch.loads) {
    if (load.seq != chunk.seq) continue;
    for (int64_t j = 0; j < std::ssize(load.chunks); ++j) {
      const int64_t b = load.first_block + j - first;
      if (b >= 0 && b < std::ssize(loaded)) loaded[b] = true;
    }
  }
  for (int64_t b = chunk.computed_rows.back() / block; b < std::ssize(loaded); ++b) {
    if (!loaded[b]) {
      return invalid_argument_error(seq + "no load brings history block " +
                                    std::to_string(first + b));
    }
  }
  return Status();
}

}  // namespace strata::executor
