// Host launchers of Strata's CUDA kernels. Framework-free: raw device pointers, sizes and a
// stream. Every launcher checks its launch with STRATA_CUDA_CHECK semantics (aborts on a CUDA
// error, which is a broken invariant at this level); inputs are validated by the callers
// (kernels/torch_ops).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "strata/common/dtype.h"
#include "strata/kv/leankv_page_format.h"
#include "strata/kv/leankv_pages.h"

namespace strata::kernels {

// Launchers take the element type as strata::DType (common/dtype.h); each supports the float
// types its comment names.
using strata::DType;

// out[r, :] = weight * (x[r, :] * rsqrt(mean(x[r, :]^2) + eps)), statistics in float32.
// x, out: [num_rows, hidden] contiguous; weight: [hidden]; all of `kind`.
void launch_rms_norm(void* out, const void* x, const void* weight, int64_t num_rows,
                     int64_t hidden, float eps, DType kind, cudaStream_t stream);

// NeoX-style rotary embedding: for i < D/2,
//   out[t, h, i]       = x[t, h, i] * cos[t, i] - x[t, h, i + D/2] * sin[t, i]
//   out[t, h, i + D/2] = x[t, h, i + D/2] * cos[t, i + D/2] + x[t, h, i] * sin[t, i + D/2]
// x, out: [num_tokens, num_heads, head_dim] contiguous; cos, sin: [num_tokens, head_dim].
// Products are rounded to `kind` before the sum, as the unfused ATen expression does.
void launch_rotary(void* out, const void* x, const void* cos, const void* sin, int64_t num_tokens,
                   int64_t num_heads, int64_t head_dim, DType kind, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Paged attention over the KV pool (docs/kernels/paged-attention.md).
//
// Layouts (all strides in elements; the last dimension of every tensor is contiguous):
//   q            [num_tokens, num_heads, head_dim], `kind`; queries of all sequences packed in
//                sequence order; row/head strides q_stride_token/q_stride_head.
//   kv_cache     [num_blocks, 2, num_kv_heads, block_size, head_dim], `kind`; index 0 of dim 1
//                is K (stored after RoPE), 1 is V; strides kv_stride_block/_kv/_head/_token.
//   block_tables [num_seqs, max_blocks_per_seq] int32, contiguous: this layer's table; entry j
//                holds the block of tokens [j * block_size, (j + 1) * block_size). Entries at or
//                past ceil(seq_lens[s] / block_size) are never read.
//   seq_lens     [num_seqs] int32: context length of each sequence INCLUDING its new tokens.
//   cu_q_lens    [num_seqs + 1] int32: prefix sums of the per-sequence query counts;
//                cu_q_lens[0] = 0, cu_q_lens[num_seqs] = num_tokens.
//   out          [num_tokens, num_heads, head_dim] contiguous, `kind`.
// Query i of sequence s (0-based within the sequence) is at absolute position
// seq_lens[s] - q_len_s + i and attends to keys [0, that position]. Query head h reads kv head
// h / (num_heads / num_kv_heads). softmax(q k^T * scale) v, accumulated in float32.
struct PagedAttentionParams {
  void* out = nullptr;
  const void* q = nullptr;
  const void* kv_cache = nullptr;
  const int32_t* block_tables = nullptr;  // device pointers, all of them
  const int32_t* seq_lens = nullptr;
  const int32_t* cu_q_lens = nullptr;
  int64_t q_stride_token = 0;
  int64_t q_stride_head = 0;
  int64_t kv_stride_block = 0;
  int64_t kv_stride_kv = 0;
  int64_t kv_stride_head = 0;
  int64_t kv_stride_token = 0;
  int64_t num_tokens = 0;
  int64_t num_seqs = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;            // 64 or 128 (compile-time variants)
  int64_t block_size = 0;          // a power of two; 8, 16 and 32 are tested
  int64_t max_blocks_per_seq = 0;  // width of block_tables; bounds every context length
  int64_t max_q_len = 0;           // >= every q_len_s (host-known; picks the work split)
  float scale = 1.0f;
  DType kind = DType::kBFloat16;  // kFloat16 or kBFloat16
  // Split-K scratch, device memory of at least paged_attention_workspace_bytes(*this) bytes
  // (16-byte aligned); may be null when that is 0. Only this launch uses it (stream-ordered).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Bytes of workspace launch_paged_attention needs for these sizes on the current CUDA device:
// it reads the size fields, `kind` and the SM count and occupancy of the kernel variant (no
// device sync). 0 when the launch does not split. Aborts on an unsupported head_dim or kind.
size_t paged_attention_workspace_bytes(const PagedAttentionParams& params);

// Computes `out` as described above on `stream`. Aborts (broken invariant) on an unsupported
// head_dim, kind or block_size, or a workspace smaller than paged_attention_workspace_bytes.
// REQUIRES: num_heads % num_kv_heads == 0; q_len_s <= seq_lens[s] <= max_blocks_per_seq *
// block_size; every table entry read is a valid block id; q, kv_cache and the strides 16-byte
// aligned (strides multiples of 8 elements). The index arrays are not validated on the device.
void launch_paged_attention(const PagedAttentionParams& params, cudaStream_t stream);

// Writes new K/V into the pool: for every token t with slot = slot_mapping[t] >= 0,
//   kv_cache[slot / block_size, 0, h, slot % block_size, :] = key[t, h, :]
//   kv_cache[slot / block_size, 1, h, slot % block_size, :] = value[t, h, :]
// Tokens with a negative slot are skipped. The copy is dtype-agnostic (elem_size_bytes); it uses
// 16-byte vectors when every pointer and stride allows, element copies otherwise.
struct ReshapeAndCacheParams {
  void* kv_cache = nullptr;  // [num_blocks, 2, num_kv_heads, block_size, head_dim], see above
  const void* key = nullptr;    // [num_tokens, num_kv_heads, head_dim], last dim contiguous
  const void* value = nullptr;  // [num_tokens, num_kv_heads, head_dim], last dim contiguous
  const int64_t* slot_mapping = nullptr;  // [num_tokens] int64, device
  int64_t key_stride_token = 0;  // strides in elements
  int64_t key_stride_head = 0;
  int64_t value_stride_token = 0;
  int64_t value_stride_head = 0;
  int64_t kv_stride_block = 0;
  int64_t kv_stride_kv = 0;
  int64_t kv_stride_head = 0;
  int64_t kv_stride_token = 0;
  int64_t num_tokens = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  int64_t elem_size_bytes = 0;  // 2 (fp16/bf16) or 4 (fp32)
};

// REQUIRES: every slot < num_blocks * block_size; no two tokens share a slot.
void launch_reshape_and_cache(const ReshapeAndCacheParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// LeanKV's page manager on the device: kv/leankv_pages.h's allocate_pages, release_pages and
// split_pages (same contract, bit-identical state) over device memory, each one thread block and
// one prefix sum for the whole batch. The state and the batch's arrays are device pointers; the
// launch reads nothing back (a failed allocation shows in counters[kShortfall]).
void launch_leankv_allocate(const kv::leankv::PageManagerState& state,
                            const kv::leankv::PageBatch& batch, cudaStream_t stream);
void launch_leankv_release(const kv::leankv::PageManagerState& state,
                           const kv::leankv::PageBatch& batch, cudaStream_t stream);
void launch_leankv_split(const kv::leankv::PageManagerState& state,
                         const kv::leankv::PageBatch& batch, cudaStream_t stream);

// LeanKV's decode attention over its pages (kv/leankv_page_format.h) and a full-precision window,
// one query token per sequence: kernels::aten::leankv_decode_attention's contract (leankv_ops.h).
//   q            [num_seqs, num_heads, head_dim] contiguous, `kind`
//   pool         [num_pages, page_bytes]: read, and each attended token's accumulator (scores
//                segment) grows by the max over its KV head's query heads of its probability
//   tables       [num_entries, table_width] int32, token_counts [num_entries, 2] int32 (high,
//                low tokens), entries [num_seqs, num_kv_heads] int32 (this layer's entries)
//   window       [num_seqs, 2 (K, V), num_kv_heads, window_capacity, head_dim] contiguous, `kind`
//   window_lens  [num_seqs] int32 in [1, window_capacity]; window_acc [num_seqs, num_kv_heads,
//                window_capacity] float32, grows like the pages' accumulators
//   out          [num_seqs, num_heads, head_dim] contiguous, `kind`
// REQUIRES: num_heads / num_kv_heads <= 8; high + low tokens + window_lens[s] <= max_tokens for
// every (sequence, KV head); the pool and page_bytes 16-byte aligned; workspace of
// leankv_decode_workspace_bytes bytes (float logits, this launch only).
struct LeanKvDecodeParams {
  void* out = nullptr;
  const void* q = nullptr;
  unsigned char* pool = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* token_counts = nullptr;
  const int32_t* entries = nullptr;
  const void* window = nullptr;
  const int32_t* window_lens = nullptr;
  float* window_acc = nullptr;
  float* workspace = nullptr;
  int64_t num_seqs = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // 64 or 128
  int64_t table_width = 0;
  int64_t window_capacity = 0;
  int64_t max_tokens = 0;
  int64_t page_bytes = 0;
  kv::leankv::PageSegments high;  // the page format's segments and bits per precision
  kv::leankv::PageSegments low;
  kv::leankv::PrecisionBits high_bits;
  kv::leankv::PrecisionBits low_bits;
  float scale = 1.0f;
  DType kind = DType::kBFloat16;  // kFloat16 or kBFloat16
};

size_t leankv_decode_workspace_bytes(const LeanKvDecodeParams& params);
void launch_leankv_decode_attention(const LeanKvDecodeParams& params, cudaStream_t stream);

// LeanKV's quantize-on-append: kernels::aten::leankv_write_tokens's contract, bit-identical.
// Token t's key and value rows ([num_tokens, head_dim] contiguous, `kind`: float32, float16 or
// bfloat16) are quantized per token to `bits` and stored, with acc[t] and position[t], at slot
// slot[t] of page page[t] (both int64; no two tokens share a slot) of a page of `segments`.
struct LeanKvWriteParams {
  unsigned char* pool = nullptr;
  int64_t page_bytes = 0;
  kv::leankv::PageSegments segments;
  kv::leankv::PrecisionBits bits;
  const int64_t* page = nullptr;
  const int64_t* slot = nullptr;
  const void* key = nullptr;
  const void* value = nullptr;
  const float* acc = nullptr;
  const int32_t* position = nullptr;
  int64_t num_tokens = 0;
  int64_t head_dim = 0;  // 64 or 128
  DType kind = DType::kBFloat16;
};

void launch_leankv_write_tokens(const LeanKvWriteParams& params, cudaStream_t stream);

// LeanKV's decode step, Algorithm 1 for one layer: kernels::aten::leankv_settle_plan's and
// leankv_settle_apply's contracts (leankv_ops.h), bit-identical, one block per entry (plan) and
// one warp per entry (apply). Between them the page manager allocates the plan's amounts
// (launch_leankv_allocate). Every pointer is device memory.
//   pool, tables [num_entries, table_width], token_counts [num_entries, 2] as for the decode
//   entries [m] int32 (distinct); lengths [m] int64; candidate [m] float32
//   actions [m, 3] int32 and amounts [m, 2] int32: written by the plan, read by the apply
//   key, value [m, head_dim] `kind` (float32, float16 or bfloat16); acc [m] float32;
//   position [m] int32: the candidates (apply)
struct LeanKvSettleParams {
  unsigned char* pool = nullptr;
  int64_t page_bytes = 0;
  const int32_t* tables = nullptr;
  int32_t* token_counts = nullptr;
  int64_t table_width = 0;
  kv::leankv::PageSegments high;
  kv::leankv::PageSegments low;
  kv::leankv::PrecisionBits high_bits;
  kv::leankv::PrecisionBits low_bits;
  const int32_t* entries = nullptr;
  const int64_t* lengths = nullptr;
  const float* candidate = nullptr;
  float alpha_high = 1.0f;  // kv::leankv::Thresholds' (float32, as decide() takes them)
  float alpha_low = 0.02f;
  int32_t* actions = nullptr;
  int32_t* amounts = nullptr;
  const void* key = nullptr;
  const void* value = nullptr;
  const float* acc = nullptr;
  const int32_t* position = nullptr;
  int64_t num_entries = 0;  // m
  int64_t head_dim = 0;     // 64 or 128 (apply)
  DType kind = DType::kBFloat16;
};

void launch_leankv_settle_plan(const LeanKvSettleParams& params, cudaStream_t stream);
void launch_leankv_settle_apply(const LeanKvSettleParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Whole KV blocks to and from an integer page format (kv/kv_format.h): kernels::aten's
// pack_kv_blocks / unpack_kv_blocks contract (kv_format_ops.h), bit-identical, for int8 / int4 /
// int2 keys and values in per-token or per-channel groups (KIVI, the store's lossy codec).
//   blocks  [num_blocks, 2 (K, V), num_kv_heads, block_size, head_dim] contiguous, `kind`
//           (float32, float16 or bfloat16): read by pack, written by unpack (the reference's
//           float32 values rounded to `kind`)
//   bytes   [num_blocks, block_bytes] uint8: each row the K region then the V region, a region
//           the packed codes of every head, the fp16 scales [H, groups_per_head] at
//           scales_offset and the fp16 zero points after them (kv::tensor_layout)
// One thread block per (block, K or V, head); groups_per_head * 8 bytes of dynamic shared memory.
struct KvTensorCoding {
  int32_t bits = 0;           // 8, 4 or 2
  bool per_channel = false;   // else per-token groups of group_size elements
  int32_t group_size = 0;
  int64_t region_offset = 0;  // of this tensor's region in a block's row
  int64_t scales_offset = 0;  // within the region (kv::TensorLayout)
  int64_t zeros_offset = 0;
  int64_t groups_per_head = 0;
};

struct KvBlocksParams {
  void* blocks = nullptr;
  unsigned char* bytes = nullptr;
  int64_t num_blocks = 0;
  int64_t num_kv_heads = 0;
  int64_t block_size = 0;
  int64_t head_dim = 0;
  int64_t block_bytes = 0;
  KvTensorCoding key;
  KvTensorCoding value;
  DType kind = DType::kBFloat16;
};

void launch_pack_kv_blocks(const KvBlocksParams& params, cudaStream_t stream);
void launch_unpack_kv_blocks(const KvBlocksParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Krul's decode-row statistics (docs/krul.md): kernels::aten::krul_accumulate's contract for one
// decode row per layer of each sequence, accumulated in place.
//   rows       [num_seqs, num_layers, num_heads, row_stride] float32: sequence s's post-softmax
//              attention rows over positions [0, lengths[s]) (the rest is not read)
//   lengths    [num_seqs] int64, 1 <= lengths[s] <= row_stride
//   squared    [num_seqs, num_layers, num_layers, num_heads, 2] float32, compensated sums (the
//              total is [..., 0] - [..., 1], Kahan's): for i > j,
//              += sum_c (rows[s, i, h, c] - rows[s, j, h, c])^2 (other entries untouched)
//   edge_mass  [num_seqs, num_layers, 2] float32, compensated: += the probability on each row's
//              first and last max(1, floor(len / 10)) positions (each position once), summed
//              over heads
// One thread block per (sequence, layer pair and head) and per (sequence, layer).
struct KrulRowsParams {
  const float* rows = nullptr;
  const int64_t* lengths = nullptr;
  float* squared = nullptr;
  float* edge_mass = nullptr;
  int64_t num_seqs = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t row_stride = 0;
};

void launch_krul_accumulate_rows(const KrulRowsParams& params, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// FreeKV (docs/freekv.md): page selection, the page layout conversions of offload and recall, and
// decode attention over resident tokens plus recalled pages, for one sequence and layer per
// launch (kernels::aten's freekv_* contracts, freekv_ops.h). n_q query heads read KV head
// h / (n_q / n_kv); G = n_q / n_kv <= 8; head_dim 64 or 128; pages of p tokens.

// Group-consistent selection: scores [n_kv, num_pages] float32 = aten::freekv_page_scores (the
// Quest bound of every query head over the page summaries, softmaxed over pages, averaged over
// the group) and selected [n_kv, top_k] int64 = the top_k pages of each row in ascending page
// order, ties to the lower page (aten::freekv_select), 1 <= top_k <= num_pages.
//   q           [n_q, head_dim] contiguous, `kind`
//   kmin, kmax  [num_pages, n_kv, head_dim] contiguous, `kind`
//   workspace   freekv_select_workspace_bytes bytes (float bounds, this launch only)
struct FreeKvSelectParams {
  const void* q = nullptr;
  const void* kmin = nullptr;
  const void* kmax = nullptr;
  float* scores = nullptr;
  int64_t* selected = nullptr;
  float* workspace = nullptr;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_pages = 0;
  int64_t top_k = 0;
  float scale = 1.0f;
  DType kind = DType::kBFloat16;  // kFloat16 or kBFloat16
};

size_t freekv_select_workspace_bytes(const FreeKvSelectParams& params);
void launch_freekv_select(const FreeKvSelectParams& params, cudaStream_t stream);

// Offload of one page leaving the window (token-major -> head-major) with its summary, and recall
// of selected pages (head-major -> token-major), both pure copies (bit-exact round trip):
//   offload: rows_k, rows_v [p, n_kv, head_dim] contiguous (the page's resident rows) ->
//            page [n_kv, 2 (K, V), p, head_dim] (the host pool's layout, to be copied down as one
//            block) and kmin, kmax [n_kv, head_dim] (per-channel minimum and maximum key).
//   recall:  item i = items[i] int32 {head m, slot, source}: cache_k/v[slot, :, m, :]
//            ([capacity, p, n_kv, head_dim]) <- chunks[source] ([num_chunks, 2, p, head_dim]:
//            one (page, head) of the host pool, as copied up) when source >= 0, else
//            <- from_k/v[-source - 1, :, m, :] (the other recall buffer: a delta recall). No two
//            items write one (slot, head); `from` is not `cache` when an item reads it.
struct FreeKvOffloadParams {
  const void* rows_k = nullptr;
  const void* rows_v = nullptr;
  void* page = nullptr;
  void* kmin = nullptr;
  void* kmax = nullptr;
  int64_t num_kv_heads = 0;
  int64_t page_tokens = 0;
  int64_t head_dim = 0;
  DType kind = DType::kBFloat16;  // float32, float16 or bfloat16
};

struct FreeKvRecallParams {
  const int32_t* items = nullptr;  // [num_items, 3]
  const void* chunks = nullptr;
  void* cache_k = nullptr;
  void* cache_v = nullptr;
  const void* from_k = nullptr;
  const void* from_v = nullptr;
  int64_t num_items = 0;
  int64_t num_kv_heads = 0;
  int64_t page_tokens = 0;
  int64_t row_bytes = 0;  // head_dim * element size, a multiple of 16; buffers 16-byte aligned
};

void launch_freekv_offload(const FreeKvOffloadParams& params, cudaStream_t stream);
void launch_freekv_recall(const FreeKvRecallParams& params, cudaStream_t stream);

// Decode attention of q over, per KV head m, the resident tokens and the first slots[m] pages of
// the recall buffer (aten::freekv_attention): softmax(q k^T * scale) v in float32.
//   q            [n_q, head_dim] contiguous, `kind`; out the same
//   resident_k/v [resident_tokens, n_kv, head_dim] contiguous (sink and window, every head)
//   cache_k/v    [capacity, p, n_kv, head_dim] contiguous; slots [n_kv] int64 in [0, capacity]
//   workspace    freekv_attention_workspace_bytes bytes (float logits, this launch only)
// Nothing past a head's slots is read. resident_tokens + slots[m] * p >= 1 for every head.
struct FreeKvAttentionParams {
  void* out = nullptr;
  const void* q = nullptr;
  const void* resident_k = nullptr;
  const void* resident_v = nullptr;
  const void* cache_k = nullptr;
  const void* cache_v = nullptr;
  const int64_t* slots = nullptr;
  float* workspace = nullptr;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t resident_tokens = 0;
  int64_t capacity = 0;
  int64_t page_tokens = 0;
  float scale = 1.0f;
  DType kind = DType::kBFloat16;  // kFloat16 or kBFloat16
};

size_t freekv_attention_workspace_bytes(const FreeKvAttentionParams& params);
void launch_freekv_attention(const FreeKvAttentionParams& params, cudaStream_t stream);

}  // namespace strata::kernels
