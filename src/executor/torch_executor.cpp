// libtorch implementation of Executor: a Llama/Qwen2 decoder over variable-length batches.
//
// Tokens of all chunks are packed into one [num_tokens, hidden] activation so every projection
// and MLP runs as one matmul; attention reads and writes the paged KV pool through each layer's
// page tables (kernels/attention on CUDA, the same contract in ATen on CPU).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "kernel_choice.h"
#include "layers.h"
#include "strata/common/check.h"
#include "strata/executor/executor.h"
#include "strata/kernels/torch_ops.h"
#include "strata/model/model_source.h"

namespace strata::executor {
namespace {

using kernels::KernelOp;

at::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return at::kFloat;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat16: return at::kHalf;
    case DType::kFloat8E4M3:
    case DType::kInt8:
    case DType::kInt4:
    case DType::kInt2: break;  // KV page formats, never a compute dtype (parse_dtype)
  }
  STRATA_CHECK(false) << "not a compute dtype: " << dtype_name(dtype);
  return at::kFloat;
}

struct LayerWeights {
  at::Tensor attn_norm;  // [hidden]
  at::Tensor wq, wk, wv;  // [heads * head_dim, hidden], [kv_heads * head_dim, hidden] x2
  at::Tensor bq, bk, bv;  // biases (undefined unless qkv_bias)
  at::Tensor wo;         // [hidden, heads * head_dim]
  at::Tensor ffn_norm;   // [hidden]
  at::Tensor w_gate_up;  // [2 * intermediate, hidden]: gate rows then up rows (one matmul)
  at::Tensor w_down;     // [hidden, intermediate]
};

class TorchExecutor final : public Executor {
 public:
  TorchExecutor(model::ModelConfig config, ExecutorOptions options)
      : config_(std::move(config)), options_(options) {}

  Status load(const model::ModelSource& source);

  const model::ModelConfig& config() const override { return config_; }
  const ExecutorOptions& options() const override { return options_; }
  void init_calling_thread() const override {
    at::init_num_threads();
    if (options_.num_threads > 0) at::set_num_threads(options_.num_threads);
  }
  const kv::KvGeometry& kv_geometry() const override { return kv_geometry_; }
  kv::KvFormat kv_format() const override { return kv_format_; }
  const kernels::KernelReport& kernel_report() const override { return kernel_report_; }
  int64_t kv_chunk_bytes() const override { return kv_geometry_.num_layers * block_bytes_; }
  void drop_preload(SeqId seq) override { read_buffers_.erase(seq); }
  void register_host_memory(void* data, size_t bytes) const override;
  void unregister_host_memory(void* data) const override;
  StatusOr<ForwardResult> forward(const ForwardBatch& batch) override;

 private:
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
    std::vector<const std::byte*> sources;  // one host chunk per loaded block
    // Per loaded block: the read buffer holding its first layers (undefined if none) and its row.
    std::vector<std::pair<at::Tensor, int64_t>> preloaded;
    at::Tensor destinations;                // [num_layers, num_chunks] pool block ids (device)
    at::Tensor first_positions;             // [num_chunks] first position of each block
    at::Tensor device_staging;              // CUDA: [num_layers, num_chunks, 2, Hkv, B, D]
    std::vector<at::cuda::CUDAEvent> layer_ready;  // CUDA: layer l's copies are done
    std::optional<at::cuda::CUDAEvent> copies_start, copies_end;  // CUDA: timing the copies
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
  StatusOr<at::Tensor> load_weight(const model::ModelSource& source, const std::string& name);
  Status allocate_kv_pool();
  Status validate(const ForwardBatch& batch) const;
  ForwardResult run(const ForwardBatch& batch);

  model::ModelConfig config_;
  ExecutorOptions options_;
  at::Device device_ = at::kCPU;
  at::ScalarType dtype_ = at::kFloat;
  at::Tensor embedding_;    // [vocab, hidden]
  at::Tensor output_norm_;  // [hidden]
  at::Tensor lm_head_;      // [vocab, hidden]; aliases embedding_ when tied
  at::Tensor inv_freq_;     // [head_dim / 2], float32
  std::vector<LayerWeights> layers_;
  kv::KvGeometry kv_geometry_;
  kv::KvFormat kv_format_;
  int64_t block_bytes_ = 0;  // one pool block: [2, Hkv, B, D] in dtype_
  // [num_blocks, 2, num_kv_heads, block_size, head_dim] in dtype_; keys stored after RoPE.
  at::Tensor kv_cache_;
  // [num_host_blocks, 2, num_kv_heads, block_size, head_dim] on the host (pinned with CUDA);
  // undefined when swapping is off.
  at::Tensor host_kv_cache_;
  std::unordered_map<SeqId, ReadBuffer> read_buffers_;
  std::optional<c10::cuda::CUDAStream> read_stream_;
  kernels::KernelReport kernel_report_;  // each custom op's implementation (start-up self-check)
};

StatusOr<at::Tensor> TorchExecutor::load_weight(const model::ModelSource& source,
                                                const std::string& name) {
  STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> shape, source.weight_shape(name));
  at::Tensor host = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  STRATA_RETURN_IF_ERROR(source.read_weight(
      name, std::span<float>(host.data_ptr<float>(), static_cast<size_t>(host.numel()))));
  return host.to(device_, dtype_);
}

Status TorchExecutor::load(const model::ModelSource& source) {
  dtype_ = to_scalar_type(options_.dtype);
  if (options_.device.kind == DeviceKind::kCuda) {
    const int num_devices = c10::cuda::device_count();
    if (options_.device.index >= num_devices) {
      return failed_precondition_error("device cuda:" + std::to_string(options_.device.index) +
                                       " requested but " + std::to_string(num_devices) +
                                       " CUDA device(s) are present");
    }
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(options_.device.index));
  } else if (options_.num_threads > 0) {
    at::set_num_threads(options_.num_threads);
  }
  try {
    STRATA_ASSIGN_OR_RETURN(embedding_, load_weight(source, "token_embd.weight"));
    STRATA_ASSIGN_OR_RETURN(output_norm_, load_weight(source, "output_norm.weight"));
    if (config_.tied_embeddings) {
      lm_head_ = embedding_;
    } else {
      STRATA_ASSIGN_OR_RETURN(lm_head_, load_weight(source, "output.weight"));
    }
    for (int64_t i = 0; i < config_.num_layers; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      LayerWeights w;
      STRATA_ASSIGN_OR_RETURN(w.attn_norm, load_weight(source, p + "attn_norm.weight"));
      STRATA_ASSIGN_OR_RETURN(w.wq, load_weight(source, p + "attn_q.weight"));
      STRATA_ASSIGN_OR_RETURN(w.wk, load_weight(source, p + "attn_k.weight"));
      STRATA_ASSIGN_OR_RETURN(w.wv, load_weight(source, p + "attn_v.weight"));
      if (config_.qkv_bias) {
        STRATA_ASSIGN_OR_RETURN(w.bq, load_weight(source, p + "attn_q.bias"));
        STRATA_ASSIGN_OR_RETURN(w.bk, load_weight(source, p + "attn_k.bias"));
        STRATA_ASSIGN_OR_RETURN(w.bv, load_weight(source, p + "attn_v.bias"));
      }
      STRATA_ASSIGN_OR_RETURN(w.wo, load_weight(source, p + "attn_output.weight"));
      STRATA_ASSIGN_OR_RETURN(w.ffn_norm, load_weight(source, p + "ffn_norm.weight"));
      STRATA_ASSIGN_OR_RETURN(at::Tensor gate, load_weight(source, p + "ffn_gate.weight"));
      STRATA_ASSIGN_OR_RETURN(at::Tensor up, load_weight(source, p + "ffn_up.weight"));
      w.w_gate_up = at::cat({gate, up}, 0);
      STRATA_ASSIGN_OR_RETURN(w.w_down, load_weight(source, p + "ffn_down.weight"));
      layers_.push_back(std::move(w));
    }
    const std::vector<float> inv_freq = config_.rope.inverse_frequencies();
    inv_freq_ = at::tensor(at::ArrayRef<float>(inv_freq), at::kFloat).to(device_);
  } catch (const std::exception& e) {
    return internal_error(source.path() + ": loading weights failed: " + e.what());
  }
  STRATA_RETURN_IF_ERROR(allocate_kv_pool());
  kernel_report_ = choose_kernels(config_, options_, device_, dtype_);
  return Status();
}

Status TorchExecutor::allocate_kv_pool() {
  if (options_.kv_block_size_tokens < 1) {
    return invalid_argument_error("kv_block_size_tokens must be positive, got " +
                                  std::to_string(options_.kv_block_size_tokens));
  }
  kv_format_ = kv::KvFormat::plain(options_.dtype);
  kv_geometry_.num_layers = static_cast<int32_t>(config_.num_layers);
  kv_geometry_.num_kv_heads = static_cast<int32_t>(config_.num_kv_heads);
  kv_geometry_.head_dim = static_cast<int32_t>(config_.head_dim);
  kv_geometry_.block_size_tokens = options_.kv_block_size_tokens;
  const int64_t block_bytes = int64_t{2} * config_.num_kv_heads * options_.kv_block_size_tokens *
                              config_.head_dim * static_cast<int64_t>(at::elementSize(dtype_));
  const int64_t blocks_per_context =
      (config_.max_context_tokens + options_.kv_block_size_tokens - 1) /
      options_.kv_block_size_tokens * config_.num_layers;
  int64_t bytes = options_.kv_cache_bytes;
  if (bytes == 0 && device_.is_cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    const c10::cuda::CUDAGuard guard(device_);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      return internal_error("cudaMemGetInfo failed");
    }
    bytes = static_cast<int64_t>(options_.kv_cache_memory_fraction * static_cast<double>(free_bytes));
  } else if (bytes == 0) {
    bytes = 4 * blocks_per_context * block_bytes;
  }
  const int64_t num_blocks = bytes / block_bytes;
  if (num_blocks < blocks_per_context) {
    return resource_exhausted_error(
        "a KV pool of " + std::to_string(bytes >> 20) + " MiB holds " +
        std::to_string(num_blocks) + " blocks; one full context of " +
        std::to_string(config_.max_context_tokens) + " tokens needs " +
        std::to_string(blocks_per_context));
  }
  if (num_blocks > INT32_MAX) return invalid_argument_error("KV pool has too many blocks");
  kv_geometry_.num_blocks = static_cast<int32_t>(num_blocks);
  block_bytes_ = block_bytes;
  const int64_t num_host_blocks = options_.host_kv_cache_bytes / block_bytes;
  if (num_host_blocks > INT32_MAX) return invalid_argument_error("host KV pool too large");
  kv_geometry_.num_host_blocks = static_cast<int32_t>(num_host_blocks);
  try {
    kv_cache_ = at::zeros({num_blocks, 2, config_.num_kv_heads, options_.kv_block_size_tokens,
                           config_.head_dim},
                          at::TensorOptions().dtype(dtype_).device(device_));
    if (num_host_blocks > 0) {
      host_kv_cache_ = at::empty({num_host_blocks, 2, config_.num_kv_heads,
                                  options_.kv_block_size_tokens, config_.head_dim},
                                 at::TensorOptions().dtype(dtype_).pinned_memory(device_.is_cuda()));
    }
  } catch (const std::exception& e) {
    return resource_exhausted_error("cannot allocate the KV pool: " + std::string(e.what()));
  }
  return Status();
}

Status TorchExecutor::validate(const ForwardBatch& batch) const {
  std::unordered_set<SeqId> seen;
  const int64_t block = kv_geometry_.block_size_tokens;
  for (const SequenceChunk& chunk : batch.chunks) {
    const std::string seq = "sequence " + std::to_string(chunk.seq.value);
    if (!seen.insert(chunk.seq).second) return invalid_argument_error(seq + " appears twice");
    if (chunk.tokens.empty()) return invalid_argument_error(seq + ": empty chunk");
    for (TokenId t : chunk.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return invalid_argument_error(seq + ": token id " + std::to_string(t) +
                                      " is outside the vocabulary [0, " +
                                      std::to_string(config_.vocab_size) + ")");
      }
    }
    const int64_t end = chunk.start_position + static_cast<int64_t>(chunk.tokens.size());
    if (chunk.start_position < 0 || end > config_.max_context_tokens) {
      return invalid_argument_error(seq + ": " + std::to_string(end) +
                                    " tokens exceed the context window of " +
                                    std::to_string(config_.max_context_tokens));
    }
    if (chunk.tables.size() != static_cast<size_t>(config_.num_layers)) {
      return invalid_argument_error(seq + ": " + std::to_string(chunk.tables.size()) +
                                    " page tables for " + std::to_string(config_.num_layers) +
                                    " layers");
    }
    const int64_t needed_blocks = (end + block - 1) / block;
    for (const std::vector<kv::BlockId>& table : chunk.tables) {
      if (static_cast<int64_t>(table.size()) < needed_blocks) {
        return invalid_argument_error(seq + ": page tables do not cover position " +
                                      std::to_string(end - 1));
      }
      for (int64_t j = 0; j < needed_blocks; ++j) {
        if (table[j].value < 0 || table[j].value >= kv_geometry_.num_blocks) {
          return invalid_argument_error(seq + ": block " + std::to_string(table[j].value) +
                                        " is outside the pool");
        }
      }
    }
  }
  for (const KvLoad& load : batch.loads) {
    const std::string seq = "sequence " + std::to_string(load.seq.value);
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == load.seq; });
    if (chunk == batch.chunks.end()) return invalid_argument_error(seq + ": load without a chunk");
    const int64_t end_block = load.first_block + static_cast<int64_t>(load.chunks.size());
    if (load.first_block < 0 || end_block * block > chunk->start_position) {
      return invalid_argument_error(seq + ": loaded blocks must lie below position " +
                                    std::to_string(chunk->start_position));
    }
    if (std::find(load.chunks.begin(), load.chunks.end(), nullptr) != load.chunks.end()) {
      return invalid_argument_error(seq + ": null load source");
    }
  }
  for (const KvSave& save : batch.saves) {
    const std::string seq = "sequence " + std::to_string(save.seq.value);
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == save.seq; });
    if (chunk == batch.chunks.end()) return invalid_argument_error(seq + ": save without a chunk");
    const int64_t end = chunk->start_position + static_cast<int64_t>(chunk->tokens.size());
    const int64_t end_block = save.first_block + static_cast<int64_t>(save.chunks.size());
    if (save.first_block < 0 || end_block * block > end) {
      return invalid_argument_error(seq + ": saved blocks must end by position " +
                                    std::to_string(end));
    }
    if (std::find(save.chunks.begin(), save.chunks.end(), nullptr) != save.chunks.end()) {
      return invalid_argument_error(seq + ": null save destination");
    }
  }
  for (const KvPreload& p : batch.preloads) {
    const std::string seq = "sequence " + std::to_string(p.seq.value);
    if (std::any_of(batch.chunks.begin(), batch.chunks.end(),
                    [&](const SequenceChunk& c) { return c.seq == p.seq; })) {
      return invalid_argument_error(seq + ": pre-load for a sequence of the same pass");
    }
    if (p.num_layers < 1 || p.num_layers > config_.num_layers || p.chunks.empty() ||
        std::find(p.chunks.begin(), p.chunks.end(), nullptr) != p.chunks.end()) {
      return invalid_argument_error(seq + ": pre-load needs chunks and 1.." +
                                    std::to_string(config_.num_layers) + " layers");
    }
  }
  // Each copy's source and destination must lie in their pools (device or host).
  auto check = [&](const std::vector<kv::BlockCopy>& copies, int32_t source_blocks,
                   int32_t destination_blocks, const char* what) -> Status {
    for (const kv::BlockCopy& c : copies) {
      if (c.source.value < 0 || c.source.value >= source_blocks || c.destination.value < 0 ||
          c.destination.value >= destination_blocks) {
        return invalid_argument_error(std::string(what) + " " + std::to_string(c.source.value) +
                                      " -> " + std::to_string(c.destination.value) +
                                      " is outside the pools");
      }
    }
    return Status();
  };
  const int32_t device_blocks = kv_geometry_.num_blocks;
  const int32_t host_blocks = kv_geometry_.num_host_blocks;
  STRATA_RETURN_IF_ERROR(check(batch.copies.swap_out, device_blocks, host_blocks, "swap-out"));
  STRATA_RETURN_IF_ERROR(check(batch.copies.swap_in, host_blocks, device_blocks, "swap-in"));
  STRATA_RETURN_IF_ERROR(check(batch.copies.device, device_blocks, device_blocks, "block copy"));
  return Status();
}

StatusOr<ForwardResult> TorchExecutor::forward(const ForwardBatch& batch) {
  STRATA_RETURN_IF_ERROR(validate(batch));
  try {
    return run(batch);
  } catch (const std::exception& e) {
    return internal_error(std::string("forward pass failed: ") + e.what());
  }
}

ForwardResult TorchExecutor::run(const ForwardBatch& batch) {
  c10::InferenceMode inference_mode;
  const int64_t num_seqs = static_cast<int64_t>(batch.chunks.size());
  const int64_t num_layers = config_.num_layers;
  const int64_t head_dim = config_.head_dim;
  const int64_t num_heads = config_.num_heads;
  const int64_t num_kv_heads = config_.num_kv_heads;
  const int64_t block = kv_geometry_.block_size_tokens;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);

  // Block moves, in StepCopies' order: a swap-in may land in a block a swap-out just vacated.
  auto index = [&](const std::vector<kv::BlockCopy>& copies, bool source, at::Device device) {
    std::vector<int64_t> ids;
    for (const kv::BlockCopy& c : copies) ids.push_back(source ? c.source.value : c.destination.value);
    return at::tensor(ids, long_opts).to(device);
  };
  const kv::StepCopies& copies = batch.copies;
  if (!copies.swap_out.empty()) {
    host_kv_cache_.index_copy_(
        0, index(copies.swap_out, false, at::kCPU),
        kv_cache_.index_select(0, index(copies.swap_out, true, device_)).to(at::kCPU));
  }
  if (!copies.swap_in.empty()) {
    kv_cache_.index_copy_(
        0, index(copies.swap_in, false, device_),
        host_kv_cache_.index_select(0, index(copies.swap_in, true, at::kCPU)).to(device_));
  }
  if (!copies.device.empty()) {
    kv_cache_.index_copy_(0, index(copies.device, false, device_),
                          kv_cache_.index_select(0, index(copies.device, true, device_)));
  }
  if (batch.chunks.empty()) {
    ForwardResult result;
    result.vocab_size = config_.vocab_size;
    result.row_offsets.push_back(0);
    return result;
  }

  // Batch metadata built on the host, then moved in one transfer per tensor.
  int64_t num_tokens = 0, max_blocks = 1, max_q_len = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    num_tokens += n;
    max_q_len = std::max(max_q_len, n);
    max_blocks = std::max(max_blocks, (chunk.start_position + n + block - 1) / block);
  }
  std::vector<int64_t> token_ids, positions, logit_rows;
  std::vector<int32_t> seq_lens, cu_q_lens = {0};
  at::Tensor tables = at::zeros({num_layers, num_seqs, max_blocks}, at::kInt);  // per layer
  at::Tensor slots = at::empty({num_layers, num_tokens}, at::kLong);  // pool slot per token
  int32_t* table_data = tables.data_ptr<int32_t>();
  int64_t* slot_data = slots.data_ptr<int64_t>();
  ForwardResult result;
  result.vocab_size = config_.vocab_size;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    const int64_t offset = static_cast<int64_t>(token_ids.size());
    result.row_offsets.push_back(static_cast<int64_t>(logit_rows.size()));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t position = chunk.start_position + i;
      token_ids.push_back(chunk.tokens[i]);
      positions.push_back(position);
      if (chunk.logits == LogitsMode::kAll || (chunk.logits == LogitsMode::kLast && i == n - 1)) {
        logit_rows.push_back(offset + i);
      }
      for (int64_t l = 0; l < num_layers; ++l) {
        slot_data[l * num_tokens + offset + i] =
            int64_t{chunk.tables[l][position / block].value} * block + position % block;
      }
    }
    const int64_t used_blocks = (chunk.start_position + n + block - 1) / block;
    for (int64_t l = 0; l < num_layers; ++l) {
      for (int64_t j = 0; j < used_blocks; ++j) {
        table_data[(l * num_seqs + s) * max_blocks + j] = chunk.tables[l][j].value;
      }
    }
    seq_lens.push_back(static_cast<int32_t>(chunk.start_position + n));
    cu_q_lens.push_back(cu_q_lens.back() + static_cast<int32_t>(n));
  }
  result.row_offsets.push_back(static_cast<int64_t>(logit_rows.size()));

  at::Tensor ids = at::tensor(token_ids, long_opts).to(device_);
  at::Tensor pos = at::tensor(positions, long_opts).to(device_);
  tables = tables.to(device_);
  slots = slots.to(device_);
  at::Tensor seq_lens_t = at::tensor(seq_lens, at::kInt).to(device_);
  at::Tensor cu_q_lens_t = at::tensor(cu_q_lens, at::kInt).to(device_);
  const RotaryTables rope = make_rotary_tables(pos, inv_freq_, dtype_);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const kernels::KernelBackend norm = kernel_report_.backend(KernelOp::kRmsNorm);
  const kernels::KernelBackend rotary = kernel_report_.backend(KernelOp::kRotary);
  const kernels::KernelBackend attention = kernel_report_.backend(KernelOp::kPagedAttention);
  const kernels::KernelBackend cache_write = kernel_report_.backend(KernelOp::kReshapeAndCache);

  const auto load_start = std::chrono::steady_clock::now();
  StagedLoads loads = stage_loads(batch);
  preload(batch);
  result.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  StagedSaves saves = stage_saves(batch);

  at::Tensor x = at::embedding(embedding_, ids);  // [num_tokens, hidden]
  for (int64_t l = 0; l < num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    if (!loads.sources.empty()) {
      const auto start = std::chrono::steady_clock::now();
      insert_loaded_layer(loads, l);
      result.load_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    at::Tensor h = kernels::rms_norm(x, w.attn_norm, config_.rms_norm_eps, norm);
    at::Tensor q = at::linear(h, w.wq, w.bq).view({num_tokens, num_heads, head_dim});
    at::Tensor k = at::linear(h, w.wk, w.bk).view({num_tokens, num_kv_heads, head_dim});
    at::Tensor v = at::linear(h, w.wv, w.bv).view({num_tokens, num_kv_heads, head_dim});
    q = kernels::apply_rotary(q, rope.cos, rope.sin, rotary);
    k = kernels::apply_rotary(k, rope.cos, rope.sin, rotary);
    kernels::reshape_and_cache(kv_cache_, k, v, slots[l], cache_write);
    if (!saves.destinations.empty()) {
      const auto start = std::chrono::steady_clock::now();
      save_layer(saves, l);
      result.save_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    at::Tensor attn = kernels::paged_attention(q, kv_cache_, tables[l], seq_lens_t, cu_q_lens_t,
                                               max_q_len, scale, attention);  // [tokens, H, D]
    x = x + at::linear(attn.view({num_tokens, num_heads * head_dim}), w.wo);

    h = kernels::rms_norm(x, w.ffn_norm, config_.rms_norm_eps, norm);
    at::Tensor gate_up = at::linear(h, w.w_gate_up);
    const int64_t ffn = config_.intermediate_size;
    x = x + at::linear(at::silu(gate_up.narrow(1, 0, ffn)) * gate_up.narrow(1, ffn, ffn),
                       w.w_down);
  }

  result.load_copy_seconds = result.load_seconds;
  if (loads.copies_end) {
    loads.copies_end->synchronize();  // the last layer's attention waited for them already
    result.load_copy_seconds = loads.copies_start->elapsed_time(*loads.copies_end) / 1000.0;
  }
  if (saves.write) {
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(*saves.write);
    // Keeps the write buffer alive until its copies have finished.
    result.saves_written = [buffer = saves.write_buffer, done] { done->synchronize(); };
  }

  if (logit_rows.empty()) return result;
  at::Tensor rows = at::tensor(logit_rows, long_opts).to(device_);
  at::Tensor last =
      kernels::rms_norm(x.index_select(0, rows), output_norm_, config_.rms_norm_eps, norm);
  at::Tensor logits = at::linear(last, lm_head_).to(at::kCPU, at::kFloat).contiguous();
  result.logits.assign(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel());
  return result;
}

void TorchExecutor::rotate_keys(at::Tensor& blocks, const at::Tensor& first_positions,
                                bool inverse) const {
  const int64_t n = blocks.size(0), heads = blocks.size(2), block = blocks.size(3);
  const int64_t dim = blocks.size(4);
  at::Tensor positions =
      (first_positions.unsqueeze(1) + at::arange(block, first_positions.options())).reshape({-1});
  if (inverse) positions = -positions;
  // In float32 whatever the pool's dtype, so a round trip loses no more than one rounding.
  const RotaryTables tables = make_rotary_tables(positions, inv_freq_, at::kFloat);
  at::Tensor keys = blocks.select(1, 0).permute({0, 2, 1, 3}).reshape({n * block, heads, dim});
  keys = kernels::apply_rotary(keys.to(at::kFloat).contiguous(), tables.cos, tables.sin,
                               kernel_report_.backend(KernelOp::kRotary));
  blocks.select(1, 0).copy_(keys.view({n, block, heads, dim}).permute({0, 2, 1, 3}));
}

TorchExecutor::StagedLoads TorchExecutor::stage_loads(const ForwardBatch& batch) {
  StagedLoads staged;
  const int64_t block = kv_geometry_.block_size_tokens;
  const int64_t num_layers = config_.num_layers;
  std::vector<int64_t> first_positions;
  std::vector<std::vector<int64_t>> destinations(num_layers);
  for (const KvLoad& load : batch.loads) {
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == load.seq; });
    // The read buffer serves the load if it holds the same chunks, from some row on.
    at::Tensor buffer;
    int64_t row = 0;
    if (auto it = read_buffers_.find(load.seq); it != read_buffers_.end()) {
      const std::vector<const std::byte*>& held = it->second.chunks;
      auto first = std::find(held.begin(), held.end(), load.chunks.front());
      if (first != held.end() && held.end() - first >= std::ssize(load.chunks) &&
          std::equal(load.chunks.begin(), load.chunks.end(), first)) {
        buffer = it->second.layers;
        row = first - held.begin();
      }
    }
    for (size_t j = 0; j < load.chunks.size(); ++j) {
      const int64_t token_block = load.first_block + static_cast<int64_t>(j);
      staged.sources.push_back(load.chunks[j]);
      staged.preloaded.emplace_back(buffer, row + static_cast<int64_t>(j));
      first_positions.push_back(token_block * block);
      for (int64_t l = 0; l < num_layers; ++l) {
        destinations[l].push_back(chunk->tables[l][token_block].value);
      }
    }
  }
  // A pre-load is for the sequence's next pass only.
  for (const SequenceChunk& c : batch.chunks) read_buffers_.erase(c.seq);
  if (staged.sources.empty()) return staged;
  const int64_t n = static_cast<int64_t>(staged.sources.size());
  std::vector<int64_t> flat;
  for (const auto& d : destinations) flat.insert(flat.end(), d.begin(), d.end());
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  staged.destinations = at::tensor(flat, long_opts).view({num_layers, n}).to(device_);
  staged.first_positions = at::tensor(first_positions, long_opts).to(device_);
  if (device_.is_cuda()) {
    // Every layer's host-to-device copies go out now on a side stream; layer l's attention waits
    // only for layer l's event, so loading later layers overlaps computing earlier ones.
    staged.device_staging = at::empty({num_layers, n, 2, config_.num_kv_heads, block,
                                       config_.head_dim},
                                      at::TensorOptions().dtype(dtype_).device(device_));
    // Layers held by a read buffer are device-to-device copies, queued behind that buffer's
    // pre-load on the same stream.
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    const c10::cuda::CUDAStream read = read_stream();
    at::cuda::CUDAEvent staging_ready;
    staging_ready.record(compute);
    staging_ready.block(read);
    staged.copies_start.emplace(cudaEventDefault);
    staged.copies_end.emplace(cudaEventDefault);
    staged.copies_start->record(read);
    auto* base = static_cast<std::byte*>(staged.device_staging.data_ptr());
    staged.layer_ready.resize(static_cast<size_t>(num_layers));
    for (int64_t l = 0; l < num_layers; ++l) {
      for (int64_t j = 0; j < n; ++j) {
        // cudaMemcpyDefault: host chunk or read buffer, the runtime tells them apart.
        const cudaError_t rc =
            cudaMemcpyAsync(base + (l * n + j) * block_bytes_, load_source(staged, j, l),
                            static_cast<size_t>(block_bytes_), cudaMemcpyDefault, read.stream());
        TORCH_CHECK(rc == cudaSuccess, "KV load copy failed: ", cudaGetErrorString(rc));
      }
      staged.layer_ready[l].record(read);
    }
    staged.copies_end->record(read);
  }
  return staged;
}

const std::byte* TorchExecutor::load_source(const StagedLoads& loads, int64_t j,
                                            int64_t layer) const {
  const auto& [buffer, row] = loads.preloaded[j];
  if (buffer.defined() && layer < buffer.size(0)) {
    return static_cast<const std::byte*>(buffer.data_ptr()) +
           (layer * buffer.size(1) + row) * block_bytes_;
  }
  return loads.sources[j] + layer * block_bytes_;
}

c10::cuda::CUDAStream TorchExecutor::read_stream() {
  if (!read_stream_) read_stream_ = c10::cuda::getStreamFromPool(false, device_.index());
  return *read_stream_;
}

void TorchExecutor::preload(const ForwardBatch& batch) {
  for (const KvPreload& p : batch.preloads) {
    const auto n = std::ssize(p.chunks);
    ReadBuffer buffer{p.chunks, at::empty({p.num_layers, n, 2, config_.num_kv_heads,
                                           kv_geometry_.block_size_tokens, config_.head_dim},
                                          at::TensorOptions().dtype(dtype_).device(device_))};
    auto* base = static_cast<std::byte*>(buffer.layers.data_ptr());
    if (!device_.is_cuda()) {
      for (int64_t l = 0; l < p.num_layers; ++l) {
        for (int64_t j = 0; j < n; ++j) {
          std::memcpy(base + (l * n + j) * block_bytes_, p.chunks[j] + l * block_bytes_,
                      static_cast<size_t>(block_bytes_));
        }
      }
    } else {
      const c10::cuda::CUDAStream read = read_stream();
      at::cuda::CUDAEvent buffer_ready;  // its memory may have been in use on the compute stream
      buffer_ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
      buffer_ready.block(read);
      for (int64_t l = 0; l < p.num_layers; ++l) {
        for (int64_t j = 0; j < n; ++j) {
          const cudaError_t rc = cudaMemcpyAsync(
              base + (l * n + j) * block_bytes_, p.chunks[j] + l * block_bytes_,
              static_cast<size_t>(block_bytes_), cudaMemcpyHostToDevice, read.stream());
          TORCH_CHECK(rc == cudaSuccess, "KV pre-load copy failed: ", cudaGetErrorString(rc));
        }
      }
      // Dropped before use, its memory must not be reused while the copies run.
      c10::cuda::CUDACachingAllocator::recordStream(buffer.layers.storage().data_ptr(), read);
    }
    read_buffers_[p.seq] = std::move(buffer);
  }
}

void TorchExecutor::insert_loaded_layer(StagedLoads& loads, int64_t layer) {
  const int64_t n = static_cast<int64_t>(loads.sources.size());
  at::Tensor blocks;
  if (device_.is_cuda()) {
    loads.layer_ready[layer].block(c10::cuda::getCurrentCUDAStream(device_.index()));
    blocks = loads.device_staging[layer].clone();
  } else {
    blocks = at::empty({n, 2, config_.num_kv_heads, kv_geometry_.block_size_tokens,
                        config_.head_dim},
                       at::TensorOptions().dtype(dtype_));
    auto* out = static_cast<std::byte*>(blocks.data_ptr());
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(out + j * block_bytes_, load_source(loads, j, layer),
                  static_cast<size_t>(block_bytes_));
    }
  }
  rotate_keys(blocks, loads.first_positions, /*inverse=*/false);
  kv_cache_.index_copy_(0, loads.destinations[layer], blocks);
}

TorchExecutor::StagedSaves TorchExecutor::stage_saves(const ForwardBatch& batch) {
  StagedSaves staged;
  const int64_t block = kv_geometry_.block_size_tokens;
  const int64_t num_layers = config_.num_layers;
  std::vector<int64_t> first_positions;
  std::vector<std::vector<int64_t>> sources(num_layers);
  for (const KvSave& save : batch.saves) {
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == save.seq; });
    for (size_t j = 0; j < save.chunks.size(); ++j) {
      const int64_t token_block = save.first_block + static_cast<int64_t>(j);
      staged.destinations.push_back(save.chunks[j]);
      first_positions.push_back(token_block * block);
      for (int64_t l = 0; l < num_layers; ++l) {
        sources[l].push_back(chunk->tables[l][token_block].value);
      }
    }
  }
  if (staged.destinations.empty()) return staged;
  const int64_t n = static_cast<int64_t>(staged.destinations.size());
  std::vector<int64_t> flat;
  for (const auto& s : sources) flat.insert(flat.end(), s.begin(), s.end());
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  staged.sources = at::tensor(flat, long_opts).view({num_layers, n}).to(device_);
  staged.first_positions = at::tensor(first_positions, long_opts).to(device_);
  if (device_.is_cuda()) {
    staged.write_buffer =
        at::empty({num_layers, n, 2, config_.num_kv_heads, block, config_.head_dim},
                  at::TensorOptions().dtype(dtype_).device(device_));
    staged.write = c10::cuda::getStreamFromPool(false, device_.index());
  }
  return staged;
}

void TorchExecutor::save_layer(StagedSaves& saves, int64_t layer) {
  const int64_t n = static_cast<int64_t>(saves.destinations.size());
  at::Tensor blocks = kv_cache_.index_select(0, saves.sources[layer]);  // [n, 2, Hkv, B, D]
  rotate_keys(blocks, saves.first_positions, /*inverse=*/true);
  if (!device_.is_cuda()) {
    const auto* base = static_cast<const std::byte*>(blocks.data_ptr());
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(saves.destinations[j] + layer * block_bytes_, base + j * block_bytes_,
                  static_cast<size_t>(block_bytes_));
    }
    return;
  }
  // The gather and un-rotation run on the compute stream into the write buffer; the host copies
  // wait for them on the write stream, overlapping the layers that follow.
  saves.write_buffer[layer].copy_(blocks);
  at::cuda::CUDAEvent gathered;
  gathered.record(c10::cuda::getCurrentCUDAStream(device_.index()));
  gathered.block(*saves.write);
  const auto* base = static_cast<const std::byte*>(saves.write_buffer[layer].data_ptr());
  for (int64_t j = 0; j < n; ++j) {
    const cudaError_t rc = cudaMemcpyAsync(
        saves.destinations[j] + layer * block_bytes_, base + j * block_bytes_,
        static_cast<size_t>(block_bytes_), cudaMemcpyDeviceToHost, saves.write->stream());
    TORCH_CHECK(rc == cudaSuccess, "KV save copy failed: ", cudaGetErrorString(rc));
  }
}

void TorchExecutor::register_host_memory(void* data, size_t bytes) const {
  if (!device_.is_cuda()) return;
  if (cudaHostRegister(data, bytes, cudaHostRegisterDefault) != cudaSuccess) {
    (void)cudaGetLastError();  // stays pageable: copies are slower but correct
  }
}

void TorchExecutor::unregister_host_memory(void* data) const {
  if (!device_.is_cuda()) return;
  if (cudaHostUnregister(data) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace

StatusOr<std::unique_ptr<Executor>> Executor::create(const model::ModelSource& source,
                                                     const ExecutorOptions& options) {
  auto executor = std::make_unique<TorchExecutor>(source.config(), options);
  STRATA_RETURN_IF_ERROR(executor->load(source));
  return std::unique_ptr<Executor>(std::move(executor));
}

}  // namespace strata::executor
