// Tensor parallelism (private to the executor; docs/tensor-parallelism.md). Rank 0's executor is
// what the engine drives: each pass's plan (block moves, chunks with their page tables, the loads
// and saves) is broadcast, every rank runs it on its part of the model (a TorchExecutor over a
// TensorShard), and rank 0 returns the logits. The scheduler runs once, on rank 0; every rank's
// KV store holds its own heads (tensor_parallel_store.h): a load names its chunks by content and
// each rank pins its own copy, a save names its sequence and each rank writes its own ticket.
//
// A message on the wire (plan_wire.h: native byte order, the ranks run one binary on one kind of
// machine; string and vectors: u32 n, then n values):
//   u8 message (kPass, kPing, kStop, kHeld, kStats), string store events (the
//   tensor_parallel_store.h events since the last message); for kHeld a held_by_all query
//   (tensor_parallel_store.h), answered by an all-gather of each rank's count; kStats (every 5 s)
//   by an all-gather of each rank's stats_row; for kPass:
//   copies  swap_out, swap_in, device: each u32 n, n x (i32 source, i32 destination)
//   chunks  u32 n, n x {u64 seq, i64 start_position, u8 logits, u8 samples, u8 compress_kv,
//                       tokens, i64 restored_tokens, computed_rows, u32 tables, tables x blocks}
//   loads   u32 n, n x {u64 seq, i64 first_block, u32 runs, runs x store::StoredRun}
//   saves   u32 n, n x {u64 seq, i64 first_block, u32 chunks}
// After a pass with loads, the ranks sum a flag per load (all-reduce): one some rank could not
// pin fails on all (ForwardResult::failed_loads).
#pragma once

#include <memory>

#include "strata/executor/executor.h"

namespace strata::executor {

// Rank 0 of options.group: loads its part of the model and returns the executor that runs every
// pass on all ranks. Pre-loads (CachedAttention's read buffer), encoded or streamed loads, KV
// layouts other than the default and attention observation are not served with tensor
// parallelism (a plan carrying one is refused with INVALID_ARGUMENT before any rank sees it).
StatusOr<std::unique_ptr<Executor>> create_tensor_parallel(const model::ModelSource& source,
                                                           const ExecutorOptions& options);

}  // namespace strata::executor
