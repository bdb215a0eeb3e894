// Tensor parallelism (private to the executor; docs/tensor-parallelism.md). Rank 0's executor is
// what the engine drives: each pass's plan (block moves, chunks with their page tables, the loaded
// chunks' bytes, the saves) is broadcast, every rank runs it on its part of the model (a
// TorchExecutor over a TensorShard), and rank 0 returns the logits and writes the saved chunks,
// whose heads it gathers from their owners. The scheduler and the KV store therefore run once, on
// rank 0, and hold whole chunks (every KV head): a conversation saved at one
// tensor_parallel_size resumes at any other, and replicas of any size share a remote tier.
//
// The plan on the wire (native byte order: the ranks run one binary on one kind of machine):
//   u8 message (kPass, kPing, kStop); for kPass:
//   copies  swap_out, swap_in, device: each u32 n, n x (i32 source, i32 destination)
//   chunks  u32 n, n x {u64 seq, i64 start_position, u8 logits, u8 samples, u8 compress_kv,
//                       u32 tokens, tokens x i32, i64 restored_tokens, u32 rows, rows x i64
//                       (computed_rows), u32 tables, tables x (u32 n, n x i32)}
//   loads   u32 n, n x {u64 seq, i64 first_block, u32 chunks, chunks x kv_chunk_bytes() bytes}
//   saves   u32 n, n x {u64 seq, i64 first_block, u32 chunks}
#pragma once

#include <memory>

#include "strata/executor/executor.h"

namespace strata::executor {

// Rank 0 of options.group: loads its part of the model and returns the executor that runs every
// pass on all ranks. Pre-loads (CachedAttention's read buffer), encoded loads, KV layouts other
// than the default and attention observation are not served with tensor parallelism (a plan
// carrying one is refused with INVALID_ARGUMENT before any rank sees it).
StatusOr<std::unique_ptr<Executor>> create_tensor_parallel(const model::ModelSource& source,
                                                           const ExecutorOptions& options);

}  // namespace strata::executor
