// The executor's layers that differ on a tensor-parallel rank (tensor_shard.h): the embedding,
// the row-parallel matmuls' sum and the LM head. Unsharded they are the plain layers.

#include <ATen/ATen.h>

#include "strata/dist/communicator.h"
#include "torch_executor.h"

namespace strata::executor {

StatusOr<at::Tensor> TorchExecutor::embed(const at::Tensor& ids) {
  if (!shard_.sharded()) return embedding_.lookup(ids);
  // Ids outside the rank's run look up its first row, zeroed; exactly one rank adds each row.
  const IndexRange& run = shard_.vocab;
  const at::Tensor mine = ids.ge(run.begin).logical_and(ids.lt(run.end));
  at::Tensor x = embedding_.lookup(at::where(mine, ids - run.begin, at::zeros_like(ids)));
  x.mul_(mine.unsqueeze(1).to(x.scalar_type()));
  STRATA_RETURN_IF_ERROR(shard_.group->all_reduce_sum(x));
  return x;
}

Status TorchExecutor::reduce_partial(at::Tensor& partial) {
  if (!shard_.sharded()) return Status();
  if (!partial.is_contiguous()) partial = partial.contiguous();
  return shard_.group->all_reduce_sum(partial);
}

StatusOr<at::Tensor> TorchExecutor::lm_logits(const at::Tensor& x) {
  at::Tensor local = lm_head_.apply(x).to(at::kFloat);  // [n, vocab run]
  if (!shard_.sharded()) return local.to(at::kCPU).contiguous();
  // Runs differ by at most one row: each is padded to the longest, gathered vocabulary-major
  // ([world * max_vocab, n]) and cut back.
  const int64_t n = x.size(0), width = shard_.max_vocab;
  at::Tensor part = at::zeros({width, n}, local.options());
  part.narrow(0, 0, local.size(1)).copy_(local.t());
  at::Tensor all = at::empty({shard_.world_size * width, n}, local.options());
  STRATA_RETURN_IF_ERROR(shard_.group->all_gather(part, all));
  std::vector<at::Tensor> runs;
  for (int32_t r = 0; r < shard_.world_size; ++r) {
    runs.push_back(all.narrow(0, r * width, shard_.vocab_of_rank[r].size()));
  }
  return at::cat(runs).t().to(at::kCPU).contiguous();
}

}  // namespace strata::executor
