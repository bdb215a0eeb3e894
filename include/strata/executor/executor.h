// The executor runs the transformer forward pass for a ForwardBatch. It owns the weights and the
// paged KV pool (the memory); which blocks belong to which sequence is the KV manager's business
// and arrives with each batch as page tables.
//
// Not thread-safe: one caller (the engine's step loop) drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/common/dtype.h"
#include "strata/common/ids.h"
#include "strata/common/status.h"
#include "strata/executor/executor_config.h"
#include "strata/executor/forward_batch.h"
#include "strata/kernels/kernel_selection.h"
#include "strata/kv/krul_policy.h"
#include "strata/kv/kv_types.h"
#include "strata/model/model_config.h"

namespace strata::model {
class ModelSource;
}
namespace strata::dist {
class Communicator;
}
namespace strata::store {
struct StoreConfig;
class StoreFollowers;
}  // namespace strata::store

namespace strata::executor {

// A compute dtype (strata::DType): "float32" | "bfloat16" | "float16" (also "fp32", "bf16",
// "fp16"); INVALID_ARGUMENT for anything else.
StatusOr<DType> parse_dtype(const std::string& name);

// The deployment file's devices, executor and kv_cache sections as they are, and the model's
// compute dtype.
struct ExecutorOptions : DevicesConfig, KernelsConfig, KvCacheConfig {
  // Built in code, an executor runs float32 on the CPU unless told otherwise; a deployment file's
  // sections replace these with their own defaults (device auto, dtype auto).
  ExecutorOptions() {
    device = {DeviceKind::kCpu, 0};
    dtype = DType::kFloat32;
  }

  // The compute dtype: float32, bfloat16 or float16; nullopt: bfloat16 on CUDA, float32 on the CPU.
  std::optional<DType> dtype;
  // Built in code, weights are dequantized (the reference tests compare against); a deployment
  // file keeps them quantized unless it says otherwise.
  WeightStorage weights = WeightStorage::kDequantize;
  // Page formats besides KvCacheConfig::page_format that sequences may take (kv::KvLayout, per
  // sequence and per layer); they share the pool's pages like it.
  std::vector<kv::KvFormat> kv_formats;
  // KV head groups besides 1 that a sequence's layout may split each layer into (per-KV-head
  // page tables; each divides the model's KV heads).
  std::vector<int32_t> kv_head_groups;
  LeanKvConfig leankv;
  FreeKvConfig freekv;  // not with leankv
  // Krul's attention observation also sums the attention each token receives (H2O's score,
  // kv::krul::AttentionStats::token_mass): set by the engine for an H2O fixed codec.
  bool observe_token_mass = false;
  // Tensor parallelism (docs/tensor-parallelism.md): this process's rank in a group of
  // tensor_parallel_size ranks (borrowed; outlives the executor). Rank 0's executor runs the
  // engine's passes on every rank; the others run serve_tensor_parallel_rank(). Null: one rank.
  dist::Communicator* group = nullptr;
  // Called once, on the step thread, when a collective fails (a rank died or hangs): every later
  // pass fails with UNAVAILABLE.
  std::function<void(const Status&)> on_group_failure;
};

// LeanKV's state over the live sequences (docs/leankv.md): stored tokens per tier, tokens pruned
// so far, pages of its pool in use; and since start, prompts it could not take (no pages or
// sequence slots: they decode from the KV pool) and what the sequences that ended held at their
// end (tokens are counted per layer and KV head): tokens per tier and in the window, their bytes
// (data, scales and zeros; the window at the compute dtype) and the bytes the same tokens take
// at bfloat16 (the compression baseline).
struct LeanKvCounts {
  int64_t high = 0, low = 0, pruned = 0;
  int64_t pages_used = 0, num_pages = 0;
  int64_t failed_prompts = 0;
  int64_t ended_sequences = 0, ended_high = 0, ended_low = 0, ended_pruned = 0, ended_window = 0;
  int64_t ended_bytes = 0, ended_bf16_bytes = 0;
};

// FreeKV (docs/freekv.md): the sequences decoding by retrieval now, and since start, over the
// layers that retrieve (not the exact first): decode steps x layers, those x KV heads, of which
// corrected (selected with the step's own query and recalled before attention), and (page, KV
// head) copies into the recall buffers from the host pages and from the buffer the step before
// used (delta recall); the seconds spent recalling (on the recall thread, and a corrected head's
// recall on the step thread), and of those the exposed ones: the step thread recalling or waiting
// for a recall. 1 - exposed / recall is the share of recall hidden behind compute.
// refused_sequences: contexts that reached the threshold but stayed on the pool, the host memory
// (freekv.host_bytes) being taken.
struct FreeKvCounts {
  int64_t sequences = 0;
  int64_t refused_sequences = 0;
  int64_t steps = 0;
  int64_t head_steps = 0;
  int64_t corrected_heads = 0;
  int64_t recalled_pages = 0;
  int64_t reused_pages = 0;
  double recall_seconds = 0;
  double recall_exposed_seconds = 0;
};

// How the weights are held (logged at start-up): the matmuls in each form (fused ones, such as
// q/k/v, count once), the embedding's form ("dense", "int8", "int4", or "tied" to the head), the
// bytes of matmul and embedding weights, and the load's wall time.
struct WeightReport {
  WeightStorage storage = WeightStorage::kDequantize;
  int64_t dense = 0, int4 = 0, int8 = 0;
  std::string embedding;
  // A quantized form the device's kernels failed their start-up check in (its weights took the
  // next form: int4 -> int8 -> dense), and why; empty when none did.
  std::string kernel_fallback;
  int64_t bytes = 0;
  double load_seconds = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Loads and converts every weight of `source` to the compute dtype on the device, then
  // allocates the KV pool (INVALID_ARGUMENT for a page format that does not fit it).
  // FAILED_PRECONDITION if CUDA is requested without a device, RESOURCE_EXHAUSTED if the pool
  // cannot hold one full context; other errors name the tensor.
  static StatusOr<std::unique_ptr<Executor>> create(const model::ModelSource& source,
                                                    const ExecutorOptions& options);

  // The model's configuration, its context window capped by options().max_context_tokens.
  virtual const model::ModelConfig& config() const = 0;
  virtual const ExecutorOptions& options() const = 0;
  // The device and compute dtype it runs on (options() resolved: never kAuto, never nullopt).
  virtual Device device() const = 0;
  virtual DType dtype() const = 0;

  // Sets up the calling thread to run forward() (intra-op thread pool size and affinity); call it
  // once on that thread before its first forward(). Without it a thread other than the one that
  // created the executor may compute single-threaded.
  virtual void init_calling_thread() const = 0;

  // Whether a load may start with chunks still being read (KvLoad::arrivals): the CPU executor's
  // loader thread waits for each before the first layer that loads it. Otherwise every chunk of
  // a load must be in host memory when forward() starts.
  virtual bool streams_loads() const = 0;

  // Shape of the KV pool, for the KV manager.
  virtual const kv::KvGeometry& kv_geometry() const = 0;
  virtual kv::KvFormat kv_format() const = 0;
  // Which implementation serves each custom op, and the self-check behind it.
  virtual const kernels::KernelReport& kernel_report() const = 0;
  virtual const WeightReport& weight_report() const = 0;

  // Bytes of one KV chunk, the KV store's unit (ForwardBatch::loads and saves): one token block of
  // every layer, [num_layers][2 (K, V)][num_kv_heads][block_size_tokens][head_dim] in the pool's
  // dtype, keys before RoPE (so they can be re-rotated to other positions). num_kv_heads: the
  // pool's (with tensor parallelism, this rank's).
  virtual int64_t kv_chunk_bytes() const = 0;
  // Bytes of one chunk encoded in `format` (the store's lossy codecs: KvLoad::encoding).
  virtual int64_t kv_chunk_bytes(const kv::KvFormat& format) const = 0;
  // Re-encodes chunks between formats (nullopt: the raw chunk) in host memory, called on the
  // store's I/O threads: in[i] -> out[i]. On CUDA the chunks are encoded and decoded on the
  // device (kernels::pack_kv_blocks / unpack_kv_blocks), on the CPU by libtorch on the calling
  // thread. INTERNAL if libtorch fails.
  virtual Status transcode_kv_chunks(const std::optional<kv::KvFormat>& from,
                                     const std::optional<kv::KvFormat>& to,
                                     std::span<const std::byte* const> in,
                                     std::span<std::byte* const> out) const = 0;
  // Krul's stored form of chunks (the store's layer-merge codec, docs/krul.md decision 8): its
  // bytes per chunk, and raw chunks in[i] -> merged out[i] with each of `pairs` (form.pairs of
  // them) merged (kernels::aten::krul_merge_chunks), or back: layers [layer_begin, layer_end) of
  // raw out[i] from the bytes of in[i] they are restored from (the other bytes of out[i] are left
  // as they are, those of in[i] not read). In libtorch on the calling thread,
  // on the host whatever the device. INVALID_ARGUMENT for pairs that are not a matching of this
  // model's layers, INTERNAL if libtorch fails.
  virtual int64_t kv_chunk_bytes(const kv::krul::MergedForm& form) const = 0;
  virtual Status merge_kv_chunks(const kv::krul::MergedForm& form,
                                 const std::vector<kv::krul::LayerPair>& pairs,
                                 std::span<const std::byte* const> in,
                                 std::span<std::byte* const> out) const = 0;
  virtual Status unmerge_kv_chunks(const kv::krul::MergedForm& form,
                                   const std::vector<kv::krul::LayerPair>& pairs,
                                   std::span<const std::byte* const> in,
                                   std::span<std::byte* const> out, int32_t layer_begin,
                                   int32_t layer_end) const = 0;
  // H2O's stored form (the store's h2o codecs, Krul's H2O baseline): the n raw chunks in[i] of a
  // conversation -> the out.size() <= n chunks each (layer, KV head) keeps
  // (kernels::aten::h2o_keep_chunks over token_mass, kv::krul::AttentionStats::token_mass of this
  // model). In libtorch on the calling thread, on the host. INVALID_ARGUMENT for a token mass of
  // another shape, FAILED_PRECONDITION for chunks not in the compute dtype (a quantized pool),
  // INTERNAL if libtorch fails.
  virtual Status keep_heavy_hitters(std::span<const float> token_mass,
                                    std::span<const std::byte* const> in,
                                    std::span<std::byte* const> out) const = 0;
  // Forgets a sequence's pre-loaded layers (ForwardBatch::preloads) that no pass will use.
  virtual void drop_preload(SeqId seq) = 0;
  // Forgets what the executor keeps of a sequence besides the pool (LeanKV's pages and window):
  // call when it finishes, is aborted or is preempted to recompute. A chunk at position 0 also
  // starts a sequence over.
  virtual void end_sequence(SeqId seq) = 0;
  // Krul's attention statistics of a sequence whose chunks observed attention
  // (SequenceChunk::observe_attention), every observed row reduced, since its last chunk at
  // position 0 or its last take; nullopt if none was observed. The executor forgets them.
  virtual std::optional<kv::krul::AttentionStats> take_attention_stats(SeqId seq) = 0;
  // LeanKV's tokens per tier and pages (zeros when LeanKV is off).
  virtual LeanKvCounts leankv_counts() const = 0;
  virtual FreeKvCounts freekv_counts() const = 0;
  // LeanKV's free pages (0 when off), and the most its next decode step of `seq` may take (0 for
  // a sequence not decoding from LeanKV's pages; at most a page per layer and KV head).
  virtual int64_t leankv_free_pages() const = 0;
  virtual int64_t leankv_step_pages(SeqId seq) const = 0;
  // Page-locks host memory that chunks are loaded from and saved to (no-op on the CPU).
  virtual void register_host_memory(void* data, size_t bytes) const = 0;
  virtual void unregister_host_memory(void* data) const = 0;

  // Runs one forward pass: performs the batch's copies and loads, writes the chunks' KV into the
  // pool, copies the saves out layer by layer and returns the requested logits; a batch without
  // chunks performs only its block copies. INVALID_ARGUMENT (naming the sequence) for an empty
  // chunk, a token id outside the vocabulary, a chunk past max_context_tokens, page tables that do
  // not cover it, a load that is not below its sequence's chunk or a save that does not end by
  // its end; nothing is written then. INTERNAL if libtorch fails.
  virtual StatusOr<ForwardResult> forward(const ForwardBatch& batch) = 0;
  // Called by the step thread when it has run no pass for a while (about a second): a
  // tensor-parallel group checks that its ranks still answer.
  virtual void keep_alive() {}
  // Tensor parallelism: the other ranks' KV stores, which do what rank 0's restore coordinator
  // reports of its store (store/store_followers.h); null with one rank. Owned by the executor.
  virtual store::StoreFollowers* store_followers() { return nullptr; }
};

// Rank > 0 of a tensor-parallel group (ExecutorOptions::group): loads this rank's part of the
// model and runs the passes rank 0's executor sends, until that executor is destroyed (OK) or the
// group fails (UNAVAILABLE: a rank died, or nothing came within the collective timeout). With
// `store` enabled (the deployment's kv_store), keeps a KV store of this rank's heads that does
// what rank 0's does (store/store_followers.h).
Status serve_tensor_parallel_rank(const model::ModelSource& source, const ExecutorOptions& options,
                                  const store::StoreConfig& store);

}  // namespace strata::executor
