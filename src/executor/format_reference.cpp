// Layers that are not on the pool's base view (kv::KvLayout): pages of another format than the
// base one, or per-KV-head page tables. Their keys and values are written by re-quantizing the
// blocks they land in, and their attention reads a dequantized copy of the blocks, both through
// the page formats' libtorch reference (kernels/kv_format_ops.h, via KvPool). This is the CPU
// path for every format, and the CUDA path until a format has a kernel of its own.

#include <algorithm>

#include "torch_executor.h"

namespace strata::executor {

void TorchExecutor::write_other_formats(const ForwardBatch& batch, int64_t layer,
                                        const at::Tensor& k, const at::Tensor& v) {
  const int64_t block = kv_geometry_.block_size_tokens;
  const int64_t dim = config_.head_dim;
  int64_t row = 0;  // the chunk's first row of k and v
  for (const SequenceChunk& chunk : batch.chunks) {
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    if (on_base_view(chunk, layer) || shares(chunk, layer)) {
      row += n;
      continue;
    }
    const int32_t groups = groups_of(chunk);
    const int64_t heads = config_.num_kv_heads / groups;
    const int64_t first = chunk.start_position / block;
    const int64_t end = chunk.start_position + n;
    const int64_t num_blocks = (end + block - 1) / block - first;
    const int64_t offset = chunk.start_position - first * block;
    const int64_t tail = num_blocks * block - (offset + n);
    for (int32_t g = 0; g < groups; ++g) {
      const int64_t t = layer * groups + g;
      const kv::KvFormat& format = format_of(chunk, t);
      const std::vector<kv::BlockId> blocks(chunk.tables[t].begin() + first,
                                            chunk.tables[t].begin() + first + num_blocks);
      // [2, num_blocks * B, heads, D]: the blocks' positions in order, K then V.
      at::Tensor positions = pool_.read(blocks, format, heads_of(chunk))
                                 .permute({1, 0, 3, 2, 4})
                                 .reshape({2, num_blocks * block, heads, dim});
      positions[0].narrow(0, offset, n).copy_(k.narrow(0, row, n).narrow(1, g * heads, heads));
      positions[1].narrow(0, offset, n).copy_(v.narrow(0, row, n).narrow(1, g * heads, heads));
      // Positions past the sequence's end repeat its last token, so a group spanning tokens (per
      // channel) is quantized over the sequence's values only.
      if (tail > 0) {
        positions.narrow(1, offset + n, tail).copy_(positions.narrow(1, offset + n - 1, 1));
      }
      pool_.write(blocks, format, heads_of(chunk),
                  positions.view({2, num_blocks, block, heads, dim}).permute({1, 0, 3, 2, 4}));
    }
    row += n;
  }
}

at::Tensor TorchExecutor::attend_dequantized(const ForwardBatch& batch, int64_t layer,
                                             const at::Tensor& q, const at::Tensor& seq_lens,
                                             const at::Tensor& cu_q_lens, int64_t max_q_len,
                                             double scale, kernels::KernelBackend backend) {
  const int64_t block = kv_geometry_.block_size_tokens;
  const int64_t num_seqs = static_cast<int64_t>(batch.chunks.size());
  int64_t max_blocks = 1;
  for (const SequenceChunk& chunk : batch.chunks) {
    const int64_t end = chunk.start_position + static_cast<int64_t>(chunk.tokens.size());
    max_blocks = std::max(max_blocks, (end + block - 1) / block);
  }
  // Every block the batch reads in this layer, in the compute dtype with all KV heads (a per-head
  // table's blocks joined head group by head group), each sequence's in a run.
  std::vector<at::Tensor> parts;
  at::Tensor tables = at::zeros({num_seqs, max_blocks}, at::kInt);
  int32_t* table_data = tables.data_ptr<int32_t>();
  int32_t next = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    const int64_t end = chunk.start_position + static_cast<int64_t>(chunk.tokens.size());
    const int64_t used = (end + block - 1) / block;
    const int32_t groups = groups_of(chunk);
    std::vector<at::Tensor> group_blocks;
    for (int32_t g = 0; g < groups; ++g) {
      const std::vector<kv::BlockId>& table = chunk.tables[layer * groups + g];
      group_blocks.push_back(pool_.read({table.begin(), table.begin() + used},
                                        format_of(chunk, layer * groups + g), heads_of(chunk)));
    }
    parts.push_back(groups == 1 ? group_blocks[0] : at::cat(group_blocks, 2));
    for (int64_t j = 0; j < used; ++j) table_data[s * max_blocks + j] = next++;
  }
  const at::Tensor copy = at::cat(parts, 0);
  return kernels::paged_attention(q, copy, tables.to(device_), seq_lens, cu_q_lens, max_q_len,
                                  scale, backend);
}

}  // namespace strata::executor
