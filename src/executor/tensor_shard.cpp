#include "tensor_shard.h"

#include <algorithm>
#include <string>

namespace strata::executor {
namespace {

constexpr int64_t kFfnUnit = 32;  // the int4 kernels' group along the input dimension

// Run r of `n` items split into `parts` contiguous runs that differ by at most one.
IndexRange even_run(int64_t n, int64_t parts, int64_t r) { return {r * n / parts, (r + 1) * n / parts}; }

}  // namespace

StatusOr<TensorShard> TensorShard::plan(const model::ModelConfig& config, int32_t rank,
                                        int32_t world_size) {
  const int64_t heads = config.num_heads, kv_heads = config.num_kv_heads;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return invalid_argument_error("tensor-parallel rank " + std::to_string(rank) + " of " +
                                  std::to_string(world_size));
  }
  if (world_size > heads) {
    return invalid_argument_error("tensor_parallel_size " + std::to_string(world_size) +
                                  " exceeds the model's " + std::to_string(heads) +
                                  " attention heads");
  }
  TensorShard s;
  s.rank = rank;
  s.world_size = world_size;
  const int64_t group = heads / kv_heads;  // query heads per KV head
  for (int32_t r = 0; r < world_size; ++r) {
    IndexRange kv, q;
    if (kv_heads >= world_size) {
      kv = even_run(kv_heads, world_size, r);
      q = {kv.begin * group, kv.end * group};
    } else {
      // KV head k is replicated on the ranks r with floor(r * kv_heads / world) == k; they split
      // its group of query heads evenly.
      const int64_t k = r * kv_heads / world_size;
      int64_t first = r, count = 0;
      while (first > 0 && (first - 1) * kv_heads / world_size == k) --first;
      for (int64_t t = first; t < world_size && t * kv_heads / world_size == k; ++t) ++count;
      if (count > group) {
        return invalid_argument_error("tensor_parallel_size " + std::to_string(world_size) +
                                      " puts " + std::to_string(count) + " ranks on a KV head of " +
                                      std::to_string(group) + " query heads");
      }
      kv = {k, k + 1};
      const IndexRange part = even_run(group, count, r - first);
      q = {k * group + part.begin, k * group + part.end};
    }
    s.kv_heads_of_rank.push_back(kv);
    s.max_kv_heads = std::max(s.max_kv_heads, kv.size());
    if (r == rank) {
      s.kv_heads = kv;
      s.q_heads = q;
    }
    const IndexRange vocab = even_run(config.vocab_size, world_size, r);
    s.vocab_of_rank.push_back(vocab);
    s.max_vocab = std::max(s.max_vocab, vocab.size());
  }
  s.vocab = s.vocab_of_rank[rank];
  const int64_t ffn = config.intermediate_size;
  if (ffn % kFfnUnit == 0 && ffn / kFfnUnit >= world_size) {
    const IndexRange units = even_run(ffn / kFfnUnit, world_size, rank);
    s.ffn = {units.begin * kFfnUnit, units.end * kFfnUnit};
  } else {
    s.ffn = even_run(ffn, world_size, rank);
  }
  return s;
}

int32_t TensorShard::owner_of_kv_head(int64_t head) const {
  for (int32_t r = 0; r < world_size; ++r) {
    const IndexRange& kv = kv_heads_of_rank[r];
    if (head >= kv.begin && head < kv.end) return r;
  }
  return -1;
}

}  // namespace strata::executor
