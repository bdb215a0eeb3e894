// Which part of the model one rank of a tensor-parallel group holds (private to the executor),
// Megatron-style (docs/tensor-parallelism.md):
//   attention  query heads and the KV heads they read: with at least as many KV heads as ranks,
//              each rank takes a contiguous run of KV heads (runs differ by at most one) and every
//              query head of their groups; with fewer, each KV head is replicated on the ranks
//              that split its group of query heads. Either way a rank's query heads are a
//              contiguous run whose groups map evenly onto its KV heads, so the paged attention
//              kernels run unchanged on the rank's heads. q/k/v rows are split (column-parallel),
//              the output projection's columns (row-parallel), then an all-reduce.
//   MLP        intermediate units split in runs of 32 (the int4 kernels' group) where the size
//              allows, gate/up rows and down columns alike, then an all-reduce.
//   vocabulary embedding rows and LM head rows split in contiguous runs: an id outside the rank's
//              run looks up zeros and an all-reduce sums the one rank's row; the LM head's rows
//              are all-gathered for sampling.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/common/status.h"
#include "strata/model/model_config.h"

namespace strata::dist {
class Communicator;
}

namespace strata::executor {

struct IndexRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

struct TensorShard {
  int32_t rank = 0;
  int32_t world_size = 1;
  IndexRange q_heads, kv_heads, ffn, vocab;
  // Every rank's KV heads, in rank order (saves are assembled from their owners: the first rank
  // holding each head), and the most any rank holds (every rank sizes its pool by it, so that all
  // ranks have the same number of blocks).
  std::vector<IndexRange> kv_heads_of_rank;
  int64_t max_kv_heads = 0;
  int64_t max_vocab = 0;  // the longest vocabulary run (the LM head's gather pads to it)
  std::vector<IndexRange> vocab_of_rank;
  dist::Communicator* group = nullptr;  // borrowed; null when world_size is 1

  // INVALID_ARGUMENT when the model cannot be split that way (more ranks than query heads).
  static StatusOr<TensorShard> plan(const model::ModelConfig& config, int32_t rank,
                                    int32_t world_size);
  bool sharded() const { return world_size > 1; }
  // The rank that holds KV head `head` first (the owner of its saved bytes).
  int32_t owner_of_kv_head(int64_t head) const;
};

}  // namespace strata::executor
