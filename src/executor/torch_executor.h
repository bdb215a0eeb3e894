// libtorch implementation of Executor (private to the executor module): a Llama/Qwen2 decoder
// over variable-length batches.
//
// Tokens of all chunks are packed into one [num_tokens, hidden] activation so every projection
// and MLP runs as one matmul; attention reads and writes the paged KV pool through each layer's
// page tables (kernels/attention on CUDA, the same contract in ATen on CPU).
//
// Files: torch_executor.cpp (weights, the pool, the forward pass), batch_validation.cpp (a batch's
// checks), kv_transfers.cpp (the KV store's loads, pre-loads and saves around it),
// format_reference.cpp (layers not on the pool's base view: pages of other formats, per-KV-head
// tables), leankv_runtime.cpp (LeanKV's per-sequence state: prompts compressed into its pages,
// decode from them), sharded_layers.cpp (the layers that differ on a tensor-parallel rank).
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attention_observer.h"
#include "freekv_runtime.h"
#include "kv_pool.h"
#include "layer_loader.h"
#include "layers.h"
#include "leankv_runtime.h"
#include "linear_weight.h"
#include "tensor_shard.h"
#include "strata/executor/executor.h"
#include "strata/kernels/torch_ops.h"

namespace strata::executor {

struct LayerWeights {
  at::Tensor attn_norm;    // [hidden]
  LinearWeight w_qkv;      // [(heads + 2 * kv_heads) * head_dim, hidden]: q, k, v rows (one matmul)
  at::Tensor b_qkv;        // its bias (undefined unless qkv_bias)
  LinearWeight wo;         // [hidden, heads * head_dim]
  at::Tensor ffn_norm;     // [hidden]
  LinearWeight w_gate_up;  // [2 * intermediate, hidden]: gate rows then up rows (one matmul)
  LinearWeight w_down;     // [hidden, intermediate]
};

class TorchExecutor final : public Executor {
 public:
  // shard: the part of the model this rank of a tensor-parallel group holds (tensor_shard.h);
  // the whole model by default.
  TorchExecutor(model::ModelConfig config, ExecutorOptions options, TensorShard shard = {})
      : model_config_(config),
        config_(std::move(config)),
        options_(options),
        shard_(std::move(shard)),
        attention_observer_(
            static_cast<int32_t>(config_.num_layers), static_cast<int32_t>(config_.num_heads),
            static_cast<int32_t>(options.observe_token_mass ? config_.num_kv_heads : 0)) {}

  Status load(const model::ModelSource& source);

  const model::ModelConfig& config() const override { return model_config_; }
  const ExecutorOptions& options() const override { return options_; }
  Device device() const override { return device_choice_; }
  DType dtype() const override { return compute_dtype_; }
  void init_calling_thread() const override;
  // On CUDA the read stream's copies are queued before the pass: their chunks must be there.
  bool streams_loads() const override { return !device_.is_cuda(); }
  const kv::KvGeometry& kv_geometry() const override { return kv_geometry_; }
  kv::KvFormat kv_format() const override { return kv_format_; }
  const kernels::KernelReport& kernel_report() const override { return kernel_report_; }
  const WeightReport& weight_report() const override { return weight_report_; }
  int64_t kv_chunk_bytes() const override { return kv_geometry_.num_layers * block_bytes_; }
  int64_t kv_chunk_bytes(const kv::KvFormat& format) const override;
  Status transcode_kv_chunks(const std::optional<kv::KvFormat>& from,
                             const std::optional<kv::KvFormat>& to,
                             std::span<const std::byte* const> in,
                             std::span<std::byte* const> out) const override;
  int64_t kv_chunk_bytes(const kv::krul::MergedForm& form) const override;
  Status merge_kv_chunks(const kv::krul::MergedForm& form,
                         const std::vector<kv::krul::LayerPair>& pairs,
                         std::span<const std::byte* const> in,
                         std::span<std::byte* const> out) const override;
  Status keep_heavy_hitters(std::span<const float> token_mass, std::span<const std::byte* const> in,
                            std::span<std::byte* const> out) const override;
  Status unmerge_kv_chunks(const kv::krul::MergedForm& form,
                           const std::vector<kv::krul::LayerPair>& pairs,
                           std::span<const std::byte* const> in, std::span<std::byte* const> out,
                           int32_t layer_begin, int32_t layer_end) const override;
  void drop_preload(SeqId seq) override { read_buffers_.erase(seq); }
  void end_sequence(SeqId seq) override {
    if (leankv_) leankv_->end(seq);
    if (freekv_) freekv_->end(seq);
    attention_observer_.forget(seq);
  }
  std::optional<kv::krul::AttentionStats> take_attention_stats(SeqId seq) override {
    return attention_observer_.take(seq);
  }
  LeanKvCounts leankv_counts() const override {
    return leankv_ ? leankv_->counts() : LeanKvCounts{};
  }
  FreeKvCounts freekv_counts() const override {
    return freekv_ ? freekv_->counts() : FreeKvCounts{};
  }
  int64_t leankv_free_pages() const override { return leankv_ ? leankv_->free_pages() : 0; }
  int64_t leankv_step_pages(SeqId seq) const override {
    return leankv_ ? leankv_->step_pages(seq) : 0;
  }
  void register_host_memory(void* data, size_t bytes) const override;
  void unregister_host_memory(void* data) const override;
  StatusOr<ForwardResult> forward(const ForwardBatch& batch) override;

 private:
  // merge_kv_chunks (merge: every layer) or unmerge_kv_chunks of layers [layer_begin,
  // layer_end) (kv_transfers.cpp).
  Status convert_merged(const kv::krul::MergedForm& form,
                        const std::vector<kv::krul::LayerPair>& pairs,
                        std::span<const std::byte* const> in, std::span<std::byte* const> out,
                        bool merge, int32_t layer_begin, int32_t layer_end) const;
  // Pre-loaded first layers of a sequence's chunks (CachedAttention's read buffer).
  struct ReadBuffer {
    std::vector<const std::byte*> chunks;  // the host chunks, in block order
    at::Tensor layers;  // [num_layers, num_chunks, 2, Hkv, B, D] on the device: layers 0.. of them
  };
  // Copies the batch's preloads into read buffers (on CUDA: on the read stream, after the batch's
  // own loads).
  void preload(const ForwardBatch& batch);
  // The batch's loads, staged for layer-by-layer insertion into the pool.
  struct StagedLoads {
    // Loaded blocks are ordered by the first layer that loads them (a restoring chunk's layer l
    // loads only the history blocks it does not compute): layer l loads blocks
    // [0, layer_blocks[l]).
    std::vector<int64_t> layer_blocks;
    // One host chunk per loaded block; null for a streamed chunk (the loader thread takes each
    // layer of it from `arrivals`: its KvLoad's, and its index there).
    std::vector<const std::byte*> sources;
    std::vector<std::pair<const ChunkArrivals*, int64_t>> arrivals;
    // Per loaded block, its KvLoad's index in the batch; per KvLoad, whether a streamed read of
    // it failed (set on the loader thread, read after the last layer's wait).
    std::vector<int32_t> load_of;
    std::vector<char> failed;
    // CPU: seconds the loader thread spent copying (read after the last layer's wait) and the step
    // thread spent inserting (ForwardResult::load_copy_seconds).
    double copy_seconds = 0;
    double insert_seconds = 0;
    // The step thread's waits for the loader (ForwardResult::load_wait_seconds).
    double wait_seconds = 0;
    // Blocks whose chunks are encoded (KvLoad::encoding), one group per format: their indices
    // into `sources`, and on CUDA their bytes on the device, [num_layers, blocks, block_bytes].
    struct Encoded {
      kv::KvFormat format;
      int64_t block_bytes = 0;
      std::vector<int64_t> blocks;
      at::Tensor index;           // `blocks` (device)
      at::Tensor device_staging;  // CUDA
    };
    std::vector<Encoded> encoded;
    std::vector<int32_t> group;  // per loaded block: its index into `encoded`, or -1 (raw)
    // Per loaded block: the read buffer holding its first layers (undefined if none) and its row.
    std::vector<std::pair<at::Tensor, int64_t>> preloaded;
    at::Tensor destinations;     // [num_layers, num_chunks] pool block ids (device)
    at::Tensor first_positions;  // [num_chunks] first position of each block
    at::Tensor device_staging;   // CUDA: [num_layers, num_chunks, 2, Hkv, B, D]
    std::vector<at::cuda::CUDAEvent> layer_ready;                 // CUDA: layer l's copies are done
    std::optional<at::cuda::CUDAEvent> copies_start, copies_end;  // CUDA: timing the copies
    // CPU: the raw blocks of each layer, staged ahead by a loader thread into two buffers of
    // [num_chunks, 2, Hkv, B, D] (started by the first layer's insertion). Declared last: the
    // thread stops before the rest goes.
    std::array<at::Tensor, 2> cpu_staging;
    std::unique_ptr<LayerLoader> loader;
  };
  StagedLoads stage_loads(const ForwardBatch& batch);
  // Bytes of layer `layer` of staged block j: from its read buffer, or from its host chunk.
  const std::byte* load_source(const StagedLoads& loads, int64_t j, int64_t layer) const;
  // CUDA: the stream of every load and pre-load, so pre-loads are ordered before their use.
  c10::cuda::CUDAStream read_stream();
  // Writes layer `layer` of every staged chunk into its pool block, keys rotated to position.
  void insert_loaded_layer(StagedLoads& loads, int64_t layer);
  // The batch's saves, staged for layer-by-layer copies out of the pool.
  struct StagedSaves {
    std::vector<std::byte*> destinations;        // one host chunk per saved block
    at::Tensor sources;                          // [num_layers, num_chunks] pool block ids (device)
    at::Tensor first_positions;                  // [num_chunks] first position of each block
    at::Tensor write_buffer;                     // CUDA: [num_layers, num_chunks, 2, Hkv, B, D]
    std::optional<c10::cuda::CUDAStream> write;  // CUDA: the stream of the device-to-host copies
  };
  StagedSaves stage_saves(const ForwardBatch& batch);
  // Copies layer `layer` of every staged block out of the pool into its host chunk, keys rotated
  // back to before RoPE (on CUDA: into the write buffer, then an asynchronous copy to the host).
  void save_layer(StagedSaves& saves, int64_t layer);
  // blocks: [n, 2, Hkv, B, D]; rotates the keys of block i by the positions
  // first_positions[i] + [0, B) (inverse: by their negation, undoing RoPE). In place.
  void rotate_keys(at::Tensor& blocks, const at::Tensor& first_positions, bool inverse) const;
  // A norm or bias vector, in the compute dtype on the device.
  StatusOr<at::Tensor> load_vector(const model::ModelSource& source, const std::string& name);
  // The weights, and weight_report_.
  Status load_weights(const model::ModelSource& source);
  Status allocate_kv_pool();
  Status validate(const ForwardBatch& batch) const;
  // A chunk's KV layout: one entry per layer and formats the pool holds; sharing layers whose
  // tables equal their owners' over the chunk's blocks (REQUIRES the tables cover them).
  Status validate_formats(const SequenceChunk& chunk) const;
  Status validate_sharing(const SequenceChunk& chunk, int64_t needed_blocks) const;
  // Krul's restoration (SequenceChunk::restored_tokens) of one chunk of the batch.
  Status validate_restore(const ForwardBatch& batch, const SequenceChunk& chunk) const;
  // A chunk's KV head groups (page tables per layer), the KV heads of its blocks (0: all), and
  // the format of its table t (layer t / groups).
  static int32_t groups_of(const SequenceChunk& chunk) {
    return chunk.layout ? chunk.layout->head_groups : 1;
  }
  int32_t heads_of(const SequenceChunk& chunk) const {
    return groups_of(chunk) == 1 ? 0
                                 : static_cast<int32_t>(config_.num_kv_heads) / groups_of(chunk);
  }
  const kv::KvFormat& format_of(const SequenceChunk& chunk, int64_t table) const {
    const kv::KvLayout* l = chunk.layout;
    return l && table < std::ssize(l->formats) ? l->formats[table] : kv_format_;
  }
  // Whether the kernels run a chunk's layer on the pool's base view (one table of base blocks).
  bool on_base_view(const SequenceChunk& chunk, int64_t layer) const {
    return groups_of(chunk) == 1 && format_of(chunk, layer) == kv_format_;
  }
  // Whether a chunk is a decode step off the pool, from LeanKV's pages or FreeKV's layers (a chunk
  // at position 0 starts over).
  bool decodes_from_pages(const SequenceChunk& chunk) const {
    return chunk.start_position > 0 && ((leankv_ && leankv_->decoding(chunk.seq)) ||
                                        (freekv_ && freekv_->decoding(chunk.seq)));
  }
  static bool shares(const SequenceChunk& chunk, int64_t layer) {
    const kv::KvLayout* l = chunk.layout;
    return l && layer < std::ssize(l->shared_with) && l->shared_with[layer] >= 0;
  }
  // Layer `layer` of the chunks that are not on the base view there (another format, or per-head
  // tables) and do not share another layer's blocks: writes their new keys and values (k, v:
  // [num_tokens, Hkv, D], the batch's rows) by re-quantizing each block they touch from its
  // dequantized values, table by table.
  void write_other_formats(const ForwardBatch& batch, int64_t layer, const at::Tensor& k,
                           const at::Tensor& v);
  // Attention of layer `layer` over a dequantized copy of every block the batch reads there (the
  // CPU reference of attention over pages of any format): q [num_tokens, H, D].
  at::Tensor attend_dequantized(const ForwardBatch& batch, int64_t layer, const at::Tensor& q,
                                const at::Tensor& seq_lens, const at::Tensor& cu_q_lens,
                                int64_t max_q_len, double scale, kernels::KernelBackend backend);
  StatusOr<ForwardResult> run(const ForwardBatch& batch);
  // Krul's restoration (SequenceChunk::restored_tokens): the rows a layer computes when some chunk
  // of the batch restores its history, with that layer's attention metadata over them. A
  // restoring chunk's rows are two runs there, its history's first computed_rows[l] and its new
  // turn; each attends as its own query run over the chunk's page table.
  struct PartialLayer {
    at::Tensor rows;   // int64 [n]: the batch's rows this layer computes; undefined: all of them
    // Per chunk, where its rows start among them (a chunk that restores nothing computes all of
    // its rows, from there on).
    std::vector<int64_t> chunk_rows;
    RotaryTables rope;                         // of those rows
    at::Tensor slots;                          // int64 [n]: their pool slots
    at::Tensor tables, seq_lens, cu_q_lens;    // per query run: [runs, blocks], [runs], [runs + 1]
    int64_t max_q_len = 0;
  };
  // One per layer; empty when no chunk restores. tables [num_layers, num_seqs, max_blocks] int32
  // and slots [num_layers, num_tokens] int64 on the host, rope over every row of the batch.
  std::vector<PartialLayer> partial_layers(const ForwardBatch& batch, const at::Tensor& tables,
                                           const at::Tensor& slots,
                                           const RotaryTables& rope) const;
  // LeanKV and FreeKV: the keys (part 0) or values (part 1) [end, Hkv, D] of a sequence's first
  // `end` positions in a layer, read from the pool's base view.
  at::Tensor pool_part(const SequenceChunk& chunk, int64_t layer, int64_t end, int64_t part);
  // LeanKV and FreeKV's H2O: layer `layer`'s queries q [rows, H, D] of the chunks the runtime
  // observes (computing from position 0 in the pool) add to their keys' received attention. q
  // holds the rows the layer computes: every row of the batch, or part->rows when a chunk
  // restores (the observed chunks, which restore nothing, start at part->chunk_rows).
  void observe_prompts(const ForwardBatch& batch, int64_t layer, const at::Tensor& q, double scale,
                       const PartialLayer* part);
  // Krul: layer `layer`'s queries q (as for observe_prompts) of the chunks that observe attention
  // go to the attention observer with their keys so far, after the layer's attention. A decode
  // chunk's row comes from `decode_probs` when the attention kernel wrote it (paged_attention's
  // probs, [batch chunks, H, t]; undefined: computed again from the keys).
  void observe_attention(const ForwardBatch& batch, int64_t layer, const at::Tensor& q,
                         double scale, const PartialLayer* part, const at::Tensor& decode_probs);

  // The embedding's rows of `ids` (int64 [n]) -> [n, hidden]; sharded, the rank's vocabulary
  // run looks up its ids and the ranks' rows are summed.
  StatusOr<at::Tensor> embed(const at::Tensor& ids);
  // The LM head over rows x [n, hidden] -> [n, vocab] float32; sharded, the ranks' vocabulary
  // runs are gathered.
  StatusOr<at::Tensor> lm_logits(const at::Tensor& x);
  // Sharded: sums a row-parallel matmul's partial output over the ranks, in place.
  Status reduce_partial(at::Tensor& partial);

  model::ModelConfig model_config_;  // the whole model's (config())
  // This rank's part of it: its query and KV heads and intermediate units (the whole model's
  // unless sharded); vocab_size stays the whole vocabulary.
  model::ModelConfig config_;
  ExecutorOptions options_;
  TensorShard shard_;
  at::Device device_ = at::kCPU;
  Device device_choice_;                   // options_.device resolved
  DType compute_dtype_ = DType::kFloat32;  // options_.dtype resolved
  at::ScalarType dtype_ = at::kFloat;
  EmbeddingTable embedding_;  // [vocab, hidden]; the head's rows when tied (and not int4)
  at::Tensor output_norm_;    // [hidden]
  LinearWeight lm_head_;      // [vocab, hidden]
  at::Tensor inv_freq_;     // [head_dim / 2], float32
  std::vector<LayerWeights> layers_;
  kv::KvGeometry kv_geometry_;
  kv::KvFormat kv_format_;
  int64_t block_bytes_ = 0;  // one base-format block: [2, Hkv, B, D] in dtype_
  KvPool pool_;              // keys stored after RoPE
  std::unordered_map<SeqId, ReadBuffer> read_buffers_;
  std::optional<c10::cuda::CUDAStream> read_stream_;
  WeightReport weight_report_;
  kernels::KernelReport kernel_report_;  // each custom op's implementation (start-up self-check)
  std::optional<LeanKvRuntime> leankv_;  // when options_.leankv.enabled
  std::optional<FreeKvRuntime> freekv_;  // when options_.freekv.enabled
  AttentionObserver attention_observer_;  // Krul's statistics of the chunks that ask for them
};

}  // namespace strata::executor
