#include "launch_params.h"

#include <ATen/core/Tensor.h>

namespace strata::kernels {
namespace {

// The strides of the pool [num_blocks, 2, num_kv_heads, block_size, head_dim], which both
// launchers take under the same names.
template <typename Params>
void set_pool_strides(Params& params, const at::Tensor& kv_cache) {
  params.kv_stride_block = kv_cache.stride(0);
  params.kv_stride_kv = kv_cache.stride(1);
  params.kv_stride_head = kv_cache.stride(2);
  params.kv_stride_token = kv_cache.stride(3);
}

}  // namespace

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      TORCH_CHECK(false, "unsupported dtype ", t.scalar_type());
  }
}

PagedAttentionParams paged_attention_params(at::Tensor& out, const at::Tensor& q,
                                            const at::Tensor& kv_cache,
                                            const at::Tensor& block_tables,
                                            const at::Tensor& seq_lens, const at::Tensor& cu_q_lens,
                                            int64_t max_q_len, double scale) {
  PagedAttentionParams params;
  params.out = out.data_ptr();
  params.q = q.data_ptr();
  params.kv_cache = kv_cache.data_ptr();
  params.block_tables = block_tables.data_ptr<int32_t>();
  params.seq_lens = seq_lens.data_ptr<int32_t>();
  params.cu_q_lens = cu_q_lens.data_ptr<int32_t>();
  params.q_stride_token = q.stride(0);
  params.q_stride_head = q.stride(1);
  set_pool_strides(params, kv_cache);
  params.num_tokens = q.size(0);
  params.num_seqs = seq_lens.size(0);
  params.num_heads = q.size(1);
  params.num_kv_heads = kv_cache.size(2);
  params.head_dim = q.size(2);
  params.block_size = kv_cache.size(3);
  params.max_blocks_per_seq = block_tables.size(1);
  params.max_q_len = max_q_len;
  params.scale = static_cast<float>(scale);
  params.kind = dtype_of(q);
  return params;
}

ReshapeAndCacheParams reshape_and_cache_params(at::Tensor& kv_cache, const at::Tensor& key,
                                               const at::Tensor& value,
                                               const at::Tensor& slot_mapping) {
  ReshapeAndCacheParams params;
  params.kv_cache = kv_cache.data_ptr();
  params.key = key.data_ptr();
  params.value = value.data_ptr();
  params.slot_mapping = slot_mapping.data_ptr<int64_t>();
  params.key_stride_token = key.stride(0);
  params.key_stride_head = key.stride(1);
  params.value_stride_token = value.stride(0);
  params.value_stride_head = value.stride(1);
  set_pool_strides(params, kv_cache);
  params.num_tokens = key.size(0);
  params.num_kv_heads = kv_cache.size(2);
  params.head_dim = kv_cache.size(4);
  params.block_size = kv_cache.size(3);
  params.elem_size_bytes = static_cast<int64_t>(kv_cache.element_size());
  return params;
}

LeanKvDecodeParams leankv_decode_params(at::Tensor& out, const at::Tensor& q, at::Tensor& pool,
                                        const kv::leankv::PageFormat& format,
                                        const at::Tensor& tables, const at::Tensor& token_counts,
                                        const at::Tensor& entries, const at::Tensor& window,
                                        const at::Tensor& window_lens, at::Tensor& window_acc,
                                        int64_t max_tokens, double scale) {
  using kv::leankv::Precision;
  LeanKvDecodeParams params;
  params.out = out.data_ptr();
  params.q = q.data_ptr();
  params.pool = pool.data_ptr<uint8_t>();
  params.tables = tables.data_ptr<int32_t>();
  params.token_counts = token_counts.data_ptr<int32_t>();
  params.entries = entries.data_ptr<int32_t>();
  params.window = window.data_ptr();
  params.window_lens = window_lens.data_ptr<int32_t>();
  params.window_acc = window_acc.data_ptr<float>();
  params.num_seqs = q.size(0);
  params.num_heads = q.size(1);
  params.num_kv_heads = entries.size(1);
  params.head_dim = q.size(2);
  params.table_width = tables.size(1);
  params.window_capacity = window.size(3);
  params.max_tokens = max_tokens;
  params.page_bytes = format.page_bytes();
  params.high = format.segments(Precision::kHigh);
  params.low = format.segments(Precision::kLow);
  params.high_bits = format.bits(Precision::kHigh);
  params.low_bits = format.bits(Precision::kLow);
  params.scale = static_cast<float>(scale);
  params.kind = dtype_of(q);
  return params;
}

LeanKvWriteParams leankv_write_params(at::Tensor& pool, const kv::leankv::PageFormat& format,
                                      kv::leankv::Precision precision, const at::Tensor& page,
                                      const at::Tensor& slot, const at::Tensor& key,
                                      const at::Tensor& value, const at::Tensor& acc,
                                      const at::Tensor& position) {
  LeanKvWriteParams params;
  params.pool = pool.data_ptr<uint8_t>();
  params.page_bytes = format.page_bytes();
  params.segments = format.segments(precision);
  params.bits = format.bits(precision);
  params.page = page.data_ptr<int64_t>();
  params.slot = slot.data_ptr<int64_t>();
  params.key = key.data_ptr();
  params.value = value.data_ptr();
  params.acc = acc.data_ptr<float>();
  params.position = position.data_ptr<int32_t>();
  params.num_tokens = page.size(0);
  params.head_dim = key.size(1);
  params.kind = dtype_of(key);
  return params;
}

LeanKvSettleParams leankv_settle_params(at::Tensor& pool, const kv::leankv::PageFormat& format,
                                        const at::Tensor& tables, at::Tensor& token_counts,
                                        const at::Tensor& entries, const at::Tensor& lengths,
                                        const at::Tensor& candidate,
                                        const kv::leankv::Thresholds& thresholds,
                                        at::Tensor& actions, at::Tensor& amounts,
                                        const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& acc, const at::Tensor& position) {
  LeanKvSettleParams params;
  params.pool = pool.data_ptr<uint8_t>();
  params.page_bytes = format.page_bytes();
  params.tables = tables.data_ptr<int32_t>();
  params.token_counts = token_counts.data_ptr<int32_t>();
  params.table_width = tables.size(1);
  params.high = format.segments(kv::leankv::Precision::kHigh);
  params.low = format.segments(kv::leankv::Precision::kLow);
  params.high_bits = format.bits(kv::leankv::Precision::kHigh);
  params.low_bits = format.bits(kv::leankv::Precision::kLow);
  params.entries = entries.data_ptr<int32_t>();
  params.num_entries = entries.size(0);
  if (lengths.defined()) params.lengths = lengths.data_ptr<int64_t>();
  if (candidate.defined()) params.candidate = candidate.data_ptr<float>();
  params.alpha_high = static_cast<float>(thresholds.alpha_high);
  params.alpha_low = static_cast<float>(thresholds.alpha_low);
  params.actions = actions.data_ptr<int32_t>();
  params.amounts = amounts.defined() ? amounts.data_ptr<int32_t>() : nullptr;
  if (key.defined()) {
    params.key = key.data_ptr();
    params.value = value.data_ptr();
    params.acc = acc.data_ptr<float>();
    params.position = position.data_ptr<int32_t>();
    params.head_dim = key.size(1);
    params.kind = dtype_of(key);
  }
  return params;
}

namespace {

KvTensorCoding tensor_coding(const kv::TensorFormat& f, int64_t region_offset, int64_t heads,
                             int64_t block_size, int64_t head_dim) {
  const kv::TensorLayout layout = kv::tensor_layout(f, heads, block_size, head_dim);
  KvTensorCoding c;
  c.bits = dtype_bits(f.dtype);
  c.per_channel = f.grouping == kv::Grouping::kPerChannel;
  c.group_size = f.group_size;
  c.region_offset = region_offset;
  c.scales_offset = layout.scales_offset;
  c.zeros_offset = layout.zeros_offset;
  c.groups_per_head = layout.groups_per_head;
  return c;
}

}  // namespace

KvBlocksParams kv_blocks_params(at::Tensor& blocks, at::Tensor& bytes, const kv::KvFormat& format) {
  KvBlocksParams params;
  params.blocks = blocks.data_ptr();
  params.bytes = bytes.data_ptr<uint8_t>();
  params.num_blocks = blocks.size(0);
  params.num_kv_heads = blocks.size(2);
  params.block_size = blocks.size(3);
  params.head_dim = blocks.size(4);
  params.block_bytes = bytes.size(1);
  const int64_t h = params.num_kv_heads, b = params.block_size, d = params.head_dim;
  params.key = tensor_coding(format.key, 0, h, b, d);
  params.value =
      tensor_coding(format.value, kv::tensor_layout(format.key, h, b, d).total_bytes, h, b, d);
  params.kind = dtype_of(blocks);
  return params;
}

KrulRowsParams krul_rows_params(const at::Tensor& rows, const at::Tensor& lengths,
                                at::Tensor& squared, at::Tensor& edge_mass) {
  const int64_t seqs = rows.size(0), layers = rows.size(1), heads = rows.size(2);
  TORCH_CHECK(rows.dim() == 4 && lengths.sizes() == at::IntArrayRef({seqs}) &&
                  squared.sizes() == at::IntArrayRef({seqs, layers, layers, heads, 2}) &&
                  edge_mass.sizes() == at::IntArrayRef({seqs, layers, 2}) &&
                  lengths.scalar_type() == at::kLong && squared.scalar_type() == at::kFloat &&
                  edge_mass.scalar_type() == at::kFloat,
              "krul_accumulate_rows: rows ", rows.sizes(), ", lengths ", lengths.sizes(),
              ", squared ", squared.sizes(), ", edge_mass ", edge_mass.sizes());
  KrulRowsParams params;
  params.rows = rows.data_ptr<float>();
  params.lengths = lengths.data_ptr<int64_t>();
  params.squared = squared.data_ptr<float>();
  params.edge_mass = edge_mass.data_ptr<float>();
  params.num_seqs = seqs;
  params.num_layers = layers;
  params.num_heads = heads;
  params.row_stride = rows.size(3);
  return params;
}

FreeKvSelectParams freekv_select_params(at::Tensor& scores, at::Tensor& selected,
                                        const at::Tensor& q, const at::Tensor& kmin,
                                        const at::Tensor& kmax, double scale) {
  FreeKvSelectParams params;
  params.q = q.data_ptr();
  params.kmin = kmin.data_ptr();
  params.kmax = kmax.data_ptr();
  params.scores = scores.data_ptr<float>();
  params.selected = selected.data_ptr<int64_t>();
  params.num_heads = q.size(0);
  params.num_kv_heads = kmin.size(1);
  params.head_dim = q.size(1);
  params.num_pages = kmin.size(0);
  params.top_k = selected.size(1);
  params.scale = static_cast<float>(scale);
  params.kind = dtype_of(q);
  return params;
}

FreeKvOffloadParams freekv_offload_params(const at::Tensor& rows_k, const at::Tensor& rows_v,
                                          at::Tensor& page, at::Tensor& kmin, at::Tensor& kmax) {
  FreeKvOffloadParams params;
  params.rows_k = rows_k.data_ptr();
  params.rows_v = rows_v.data_ptr();
  params.page = page.data_ptr();
  params.kmin = kmin.data_ptr();
  params.kmax = kmax.data_ptr();
  params.page_tokens = rows_k.size(0);
  params.num_kv_heads = rows_k.size(1);
  params.head_dim = rows_k.size(2);
  params.kind = dtype_of(rows_k);
  return params;
}

FreeKvRecallParams freekv_recall_params(const at::Tensor& chunks, const at::Tensor& items,
                                        at::Tensor& cache_k, at::Tensor& cache_v,
                                        const at::Tensor& from_k, const at::Tensor& from_v) {
  FreeKvRecallParams params;
  params.items = items.data_ptr<int32_t>();
  params.chunks = chunks.data_ptr();
  params.cache_k = cache_k.data_ptr();
  params.cache_v = cache_v.data_ptr();
  params.from_k = from_k.data_ptr();
  params.from_v = from_v.data_ptr();
  params.num_items = items.size(0);
  params.page_tokens = cache_k.size(1);
  params.num_kv_heads = cache_k.size(2);
  params.row_bytes = cache_k.size(3) * static_cast<int64_t>(cache_k.element_size());
  return params;
}

FreeKvAttentionParams freekv_attention_params(at::Tensor& out, const at::Tensor& q,
                                              const at::Tensor& resident_k,
                                              const at::Tensor& resident_v,
                                              const at::Tensor& cache_k, const at::Tensor& cache_v,
                                              const at::Tensor& slots, double scale) {
  FreeKvAttentionParams params;
  params.out = out.data_ptr();
  params.q = q.data_ptr();
  params.resident_k = resident_k.data_ptr();
  params.resident_v = resident_v.data_ptr();
  params.cache_k = cache_k.data_ptr();
  params.cache_v = cache_v.data_ptr();
  params.slots = slots.data_ptr<int64_t>();
  params.num_heads = q.size(0);
  params.num_kv_heads = resident_k.size(1);
  params.head_dim = q.size(1);
  params.resident_tokens = resident_k.size(0);
  params.capacity = cache_k.size(0);
  params.page_tokens = cache_k.size(1);
  params.scale = static_cast<float>(scale);
  params.kind = dtype_of(q);
  return params;
}

}  // namespace strata::kernels
