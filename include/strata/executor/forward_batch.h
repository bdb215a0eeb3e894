// The unit of work the executor runs: new tokens for several sequences at once, whose KV goes
// into the paged pool through each sequence's per-layer page tables, and which logits to return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "strata/common/ids.h"
#include "strata/kv/kv_format.h"
#include "strata/kv/kv_types.h"

namespace strata::executor {

enum class LogitsMode {
  kLast,  // one row: the distribution after the chunk's last token
  kAll,   // one row per token of the chunk (perplexity, reference checks)
  kNone,  // no rows (a prefill chunk that is not the prompt's last)
};

struct SequenceChunk {
  SeqId seq;
  // Tokens at positions [start_position, start_position + tokens.size()); KV of positions
  // [0, start_position) is already in the pool.
  std::vector<TokenId> tokens;
  int64_t start_position = 0;
  // Per-layer page tables (kv::KvCacheManager::tables): tables[layer][i] holds positions
  // [i * block_size, (i + 1) * block_size) and must cover every position up to the chunk's end;
  // ignored (may be empty) for a sequence that decodes from LeanKV's pages.
  // Borrowed: must stay valid during forward().
  std::span<const std::vector<kv::BlockId>> tables;
  LogitsMode logits = LogitsMode::kLast;
  // The format of each layer's blocks and the layers that share another's (kv::KvLayout, as the
  // KV manager holds it; borrowed). nullptr or a default layout: every layer in the pool's base
  // format with its own blocks. A sharing layer's table must equal its owner's; its keys and
  // values are not written, its attention reads the owner's.
  const kv::KvLayout* layout = nullptr;
  // The chunk ends at the sequence's last token: a token is sampled after it (the last chunk of a
  // prompt, or a decode step). LeanKV compresses a prompt after its sampling chunk.
  bool samples = true;
  // false: the sequence's KV stays on the pool (LeanKV does not compress it, FreeKV does not
  // take it off) even where the executor runs one of them.
  bool compress_kv = true;
  // Krul: the chunk's attention rows add to the sequence's attention statistics
  // (Executor::take_attention_stats). Needs every layer on the base view, not LeanKV's pages.
  bool observe_attention = false;
  // Of those chunks, the rows observed: positions that are multiples of this (1: every row).
  int32_t observe_row_stride = 1;
  // Krul's restoration (docs/krul.md): the chunk's first `restored_tokens` tokens are history
  // whose KV the batch's loads also bring (whole blocks: the chunk starts and the history ends on
  // a block boundary). Layer l computes only the first computed_rows[l] of them (non-increasing
  // with depth, multiples of the block size: the deeper layers never form the hidden states of
  // the rest) and reads the others' KV from the loads, which must cover the history's blocks
  // from the smallest computed_rows on. The tokens after the history (the new turn: at least one,
  // logits kLast or kNone) are computed at every layer. 0: every token at every layer.
  int64_t restored_tokens = 0;
  std::vector<int64_t> computed_rows = {};  // one per layer when restored_tokens > 0
};

// Chunks of a load still being read when the pass starts (Krul's restoration: a resumed turn's
// stored history is read beside its recompute, layer by layer). Implemented by the restore
// coordinator; the executor calls wait() on its loader thread.
class ChunkArrivals {
 public:
  virtual ~ChunkArrivals() = default;
  // Blocks until layer `layer` of chunk j of the load has been read: the chunk (valid during
  // forward(); only the layers read so far are defined), or nullptr when a read failed (the pass
  // then lists the sequence in ForwardResult::failed_loads).
  virtual const std::byte* wait(int64_t j, int64_t layer) const = 0;
};

// KV of whole token blocks that a sequence of the batch loads instead of computing (from the KV
// store). Chunk j fills token block first_block + j of the sequence's page tables in every layer
// before that layer's attention runs; its keys are stored before RoPE and rotated to the block's
// positions on the way in. The blocks lie below the chunk's start_position, or below the end of
// its restored history (SequenceChunk::restored_tokens: the layers that compute a block
// overwrite what was loaded into it).
struct KvLoad {
  SeqId seq;
  int64_t first_block = 0;
  // Executor::kv_chunk_bytes() each, in host memory (pinned when the device is a GPU) that stays
  // valid during forward().
  std::vector<const std::byte*> chunks;
  // How the chunks are encoded (the store's lossy codec, AdaptCache): nullopt for raw chunks;
  // else each holds every layer's block in this format (kv::block_bytes), layer after layer, and
  // the executor decodes them on the device.
  std::optional<kv::KvFormat> encoding;
  // Set (raw chunks, Executor::streams_loads() only): a null chunks[j] is still being read and
  // the executor takes each layer l of it from arrivals->wait(j, l) before that layer loads it. A
  // restoring chunk's layer l loads only the history blocks it does not compute.
  std::shared_ptr<const ChunkArrivals> arrivals = {};
};

// KV of whole token blocks that a sequence of the batch writes out to host chunks (the KV store's
// asynchronous saving): chunk j receives token block first_block + j of every layer, as soon as
// the forward pass has written that layer's KV, with its keys rotated back to before RoPE (the
// chunk layout of Executor::kv_chunk_bytes()). The blocks lie below the end of the sequence's
// chunk: computed by this pass, by earlier ones, or loaded by this one.
struct KvSave {
  SeqId seq;
  int64_t first_block = 0;
  // Executor::kv_chunk_bytes() each, in host memory (pinned when the device is a GPU) that stays
  // valid until ForwardResult::saves_written has returned.
  std::vector<std::byte*> chunks;
};

// The first layers of chunks that a sequence not in the batch will load in a later pass
// (CachedAttention's read buffer): copied to the device now, overlapping this pass, and used by
// the later pass's KvLoad of the same chunks (any consecutive run of them) for those layers. A
// pre-load is dropped when its sequence next runs a chunk, used or not.
struct KvPreload {
  SeqId seq;
  std::vector<const std::byte*> chunks;  // in block order; valid until the pass that loads them
  int64_t num_layers = 0;                // layers [0, num_layers) are copied ahead
};

struct ForwardBatch {
  std::vector<SequenceChunk> chunks;  // at most one chunk per sequence
  std::vector<KvLoad> loads;
  std::vector<KvSave> saves;
  std::vector<KvPreload> preloads;
  // Block moves performed before any KV is written: swap-outs (device -> host pool), swap-ins
  // (host pool -> device), then device copies (copy-on-write).
  kv::StepCopies copies;
};

struct ForwardResult {
  int64_t vocab_size = 0;
  // Rows in chunk order (LogitsMode decides how many each chunk has): [num_rows, vocab_size],
  // float32, row-major, on the host.
  std::vector<float> logits;
  // First row of each chunk; row_offsets[i + 1] - row_offsets[i] rows belong to chunk i.
  std::vector<int64_t> row_offsets;
  double load_seconds = 0;  // host time spent on the batch's loads (their copies overlap on CUDA)
  // Time the loads' copies took (CUDA: on the read stream, timed by events; CPU: the loader
  // thread's copies and the step thread's insertions, waits for streamed reads left out), and the
  // bytes they wrote into the pool (a restoring layer copies only the blocks it does not compute):
  // the load bandwidth that sizes the read buffer and Krul's plans.
  double load_copy_seconds = 0;
  int64_t load_copy_bytes = 0;
  // CPU: the step thread's time waiting for loaded layers (the loader thread's copies, and the
  // reads of streamed loads behind them): the bubble a restoration's pipeline is to hide. 0 on
  // CUDA (the compute stream waits on events, the host does not).
  double load_wait_seconds = 0;
  double save_seconds = 0;  // host time spent on the batch's saves (likewise)
  // Tensor parallelism: rank 0's time in collectives during the pass (the plan's broadcast, the
  // all-reduces and gathers, waiting for the other ranks included).
  double collective_seconds = 0;
  // Blocks until the saves' bytes are in their chunks; empty when they already are (CPU). On CUDA
  // each layer's blocks are gathered into a device write buffer on the compute stream (the pool
  // blocks may be reused by the next pass at once) and copied to the host on a separate stream.
  std::function<void()> saves_written;
  // LeanKV: sequences whose prompt this pass compressed into the executor's pages. Their later
  // chunks decode from there and need no pool blocks (kv::KvCacheManager::move_off_pool).
  std::vector<SeqId> compressed;
  // Sequences a streamed load failed (ChunkArrivals::wait returned nullptr): their KV and logits
  // from this pass are garbage, and nothing of theirs may be kept.
  std::vector<SeqId> failed_loads;
};

}  // namespace strata::executor
