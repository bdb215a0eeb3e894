// libtorch implementation of Executor: weights, the KV pool, validation and the forward pass
// (torch_executor.h).

#include "torch_executor.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kernel_choice.h"
#include "tensor_parallel.h"
#include "strata/common/check.h"
#include "strata/dist/communicator.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/model/model_source.h"

namespace strata::executor {
namespace {

using kernels::KernelOp;

// Base blocks per page when the pool also holds smaller formats, so that their blocks cost close
// to their own bytes (with one base block per page, an int8 block of a bf16 pool would fill a
// page alone): kv/page_layout.h.
constexpr int32_t kDefaultPageBlocks = 4;
// Share of the GPU memory left after the weights that the KV pool takes by default.
constexpr double kDefaultMemoryFraction = 0.9;

}  // namespace

void TorchExecutor::init_calling_thread() const {
  at::init_num_threads();
  if (options_.cpu_threads > 0) at::set_num_threads(options_.cpu_threads);
}

StatusOr<at::Tensor> TorchExecutor::load_vector(const model::ModelSource& source,
                                                const std::string& name) {
  STRATA_ASSIGN_OR_RETURN(at::Tensor host, read_weight_float(source, name));
  return host.to(device_, dtype_);
}

Status TorchExecutor::load_weights(const model::ModelSource& source) {
  const auto start = std::chrono::steady_clock::now();
  WeightReport& report = weight_report_;
  report.storage = options_.weights;
  const bool quantized = options_.weights == WeightStorage::kQuantized;
  QuantizedKernels kernels;
  if (quantized) {
    kernels = check_quantized_kernels(device_);
    report.kernel_fallback = kernels.why_not;
  }
  auto linear = [&](std::vector<std::string> names, const WeightSlice& slice = {}) {
    return LinearWeight::load(source, names, kernels, device_, dtype_, slice);
  };
  // A sharded rank's parts (tensor_shard.h); empty ranges take the whole weight.
  WeightSlice qkv, wo, gate_up, down;
  IndexRange vocab;
  if (shard_.sharded()) {
    const int64_t d = config_.head_dim;
    const IndexRange q{shard_.q_heads.begin * d, shard_.q_heads.end * d};
    const IndexRange kv{shard_.kv_heads.begin * d, shard_.kv_heads.end * d};
    qkv.rows = {q, kv, kv};
    wo.cols = q;
    gate_up.rows = {shard_.ffn, shard_.ffn};
    down.cols = shard_.ffn;
    vocab = shard_.vocab;
  }
  auto count = [&](const LinearWeight& w) {
    ++(w.form() == WeightForm::kInt4   ? report.int4
       : w.form() == WeightForm::kInt8 ? report.int8
                                       : report.dense);
    report.bytes += w.bytes();
  };
  STRATA_ASSIGN_OR_RETURN(output_norm_, load_vector(source, "output_norm.weight"));
  STRATA_ASSIGN_OR_RETURN(
      lm_head_, linear({config_.tied_embeddings ? "token_embd.weight" : "output.weight"},
                       WeightSlice{{vocab}, {}}));
  count(lm_head_);
  if (config_.tied_embeddings && lm_head_.form() != WeightForm::kInt4) {
    embedding_ = EmbeddingTable::tied_to(lm_head_);
    report.embedding = "tied";
  } else {
    STRATA_ASSIGN_OR_RETURN(
        embedding_,
        EmbeddingTable::load(source, "token_embd.weight", quantized, device_, dtype_, vocab));
    report.embedding = weight_form_name(embedding_.form());
    report.bytes += embedding_.bytes();
  }
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights w;
    STRATA_ASSIGN_OR_RETURN(w.attn_norm, load_vector(source, p + "attn_norm.weight"));
    STRATA_ASSIGN_OR_RETURN(
        w.w_qkv, linear({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}, qkv));
    if (config_.qkv_bias) {
      std::vector<at::Tensor> biases;
      const char* parts[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
      for (size_t i = 0; i < 3; ++i) {
        STRATA_ASSIGN_OR_RETURN(at::Tensor b, load_vector(source, p + parts[i]));
        if (shard_.sharded()) b = b.narrow(0, qkv.rows[i].begin, qkv.rows[i].size());
        biases.push_back(std::move(b));
      }
      w.b_qkv = at::cat(biases);
    }
    STRATA_ASSIGN_OR_RETURN(w.wo, linear({p + "attn_output.weight"}, wo));
    STRATA_ASSIGN_OR_RETURN(w.ffn_norm, load_vector(source, p + "ffn_norm.weight"));
    STRATA_ASSIGN_OR_RETURN(w.w_gate_up,
                            linear({p + "ffn_gate.weight", p + "ffn_up.weight"}, gate_up));
    STRATA_ASSIGN_OR_RETURN(w.w_down, linear({p + "ffn_down.weight"}, down));
    for (const LinearWeight* lw : {&w.w_qkv, &w.wo, &w.w_gate_up, &w.w_down}) count(*lw);
    layers_.push_back(std::move(w));
  }
  report.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#if defined(__GLIBC__)
  // The conversions' transient buffers (float rows, int32 codes: up to 4 bytes a weight of the
  // largest tensor) were freed into malloc's heap; give them back to the system, or they stay
  // resident beside the weights (measured: 150 MiB for the default model).
  malloc_trim(0);
#endif
  return Status();
}

Status TorchExecutor::load(const model::ModelSource& source) {
  if (options_.max_context_tokens > 0) {
    config_.max_context_tokens = std::min(config_.max_context_tokens, options_.max_context_tokens);
    model_config_.max_context_tokens = config_.max_context_tokens;
  }
  if (shard_.sharded()) {
    if (options_.leankv.enabled || options_.freekv.enabled || options_.page_format ||
        !options_.kv_formats.empty() || !options_.kv_head_groups.empty()) {
      return invalid_argument_error(
          "tensor parallelism serves the compute dtype's KV pages only: drop leankv, freekv and "
          "kv_cache.page_format");
    }
    config_.num_heads = shard_.q_heads.size();
    config_.num_kv_heads = shard_.kv_heads.size();
    config_.intermediate_size = shard_.ffn.size();
  }
  device_choice_ = options_.device;
  if (device_choice_.kind == DeviceKind::kAuto) {
    device_choice_ =
        c10::cuda::device_count() > 0 ? Device{DeviceKind::kCuda, 0} : Device{DeviceKind::kCpu, 0};
  }
  compute_dtype_ = options_.dtype.value_or(
      device_choice_.kind == DeviceKind::kCuda ? DType::kBFloat16 : DType::kFloat32);
  if (dtype_is_quantized(compute_dtype_)) {
    return invalid_argument_error(std::string("compute dtype ") + dtype_name(compute_dtype_) +
                                  ": use float32, bfloat16 or float16");
  }
  dtype_ = kernels::aten::scalar_type(compute_dtype_);
  if (device_choice_.kind == DeviceKind::kCuda) {
    const int num_devices = c10::cuda::device_count();
    if (device_choice_.index >= num_devices) {
      return failed_precondition_error("device cuda:" + std::to_string(device_choice_.index) +
                                       " requested but " + std::to_string(num_devices) +
                                       " CUDA device(s) are present");
    }
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_choice_.index));
    // Krul's decode rows stay on the device (AttentionObserver).
    attention_observer_ = AttentionObserver(
        static_cast<int32_t>(config_.num_layers), static_cast<int32_t>(config_.num_heads),
        static_cast<int32_t>(options_.observe_token_mass ? config_.num_kv_heads : 0),
        /*device_accumulators=*/true);
  } else if (options_.cpu_threads > 0) {
    at::set_num_threads(options_.cpu_threads);
  }
  try {
    STRATA_RETURN_IF_ERROR(load_weights(source));
    const std::vector<float> inv_freq = config_.rope.inverse_frequencies();
    inv_freq_ = at::tensor(at::ArrayRef<float>(inv_freq), at::kFloat).to(device_);
  } catch (const std::exception& e) {
    return internal_error(source.path() + ": loading weights failed: " + e.what());
  }
  STRATA_RETURN_IF_ERROR(allocate_kv_pool());
  kernel_report_ = choose_kernels(config_, options_, device_, dtype_);
  if (options_.leankv.enabled) {
    if (options_.page_format || !options_.kv_formats.empty() || !options_.kv_head_groups.empty()) {
      return invalid_argument_error("leankv keeps its own page formats: drop kv_cache.page_format");
    }
    STRATA_ASSIGN_OR_RETURN(LeanKvRuntime runtime,
                            LeanKvRuntime::create(options_.leankv, config_, dtype_, device_,
                                                  kernel_report_.backend(KernelOp::kLeanKv)));
    leankv_.emplace(std::move(runtime));
  }
  if (options_.freekv.enabled) {
    if (options_.leankv.enabled) return invalid_argument_error("freekv and leankv exclude each other");
    const FreeKvDevice device{device_, kernel_report_.backend(KernelOp::kFreeKvSelect),
                              kernel_report_.backend(KernelOp::kFreeKvPages),
                              kernel_report_.backend(KernelOp::kFreeKvAttention)};
    STRATA_ASSIGN_OR_RETURN(
        FreeKvRuntime runtime,
        FreeKvRuntime::create(options_.freekv, config_.num_layers, config_.num_kv_heads,
                              config_.head_dim, config_.max_context_tokens, dtype_, device));
    freekv_.emplace(std::move(runtime));
  }
  return Status();
}

Status TorchExecutor::allocate_kv_pool() {
  const int64_t block = options_.block_size_tokens;
  if (block < 1) {
    return invalid_argument_error("block_size_tokens must be positive, got " +
                                  std::to_string(block));
  }
  kv_format_ = kv::KvFormat::plain(compute_dtype_);
  kv_geometry_.num_layers = static_cast<int32_t>(config_.num_layers);
  kv_geometry_.num_kv_heads = static_cast<int32_t>(config_.num_kv_heads);
  kv_geometry_.head_dim = static_cast<int32_t>(config_.head_dim);
  kv_geometry_.block_size_tokens = static_cast<int32_t>(block);
  kv_geometry_.formats = options_.kv_formats;
  if (options_.page_format) {
    kv_geometry_.formats.insert(kv_geometry_.formats.begin(), *options_.page_format);
  }
  kv_geometry_.head_groups = options_.kv_head_groups;
  // Pages of one base block unless smaller blocks (other formats, fewer heads) are to share them.
  const bool others = std::any_of(kv_geometry_.formats.begin(), kv_geometry_.formats.end(),
                                  [&](const kv::KvFormat& f) { return !(f == kv_format_); }) ||
                      std::any_of(kv_geometry_.head_groups.begin(), kv_geometry_.head_groups.end(),
                                  [](int32_t g) { return g > 1; });
  kv_geometry_.page_blocks =
      options_.page_blocks > 0 ? options_.page_blocks : (others ? kDefaultPageBlocks : 1);
  StatusOr<kv::PageLayout> layout = kv::PageLayout::create(
      kv_format_, kv_geometry_.formats, kv_geometry_.page_blocks, config_.num_kv_heads, block,
      config_.head_dim, kv_geometry_.head_groups);
  if (!layout.ok()) return invalid_argument_error("KV pool: " + layout.status().message());
  block_bytes_ = layout->block_bytes(kv_format_);
  const int64_t page_bytes = layout->page_bytes();
  const int64_t blocks_per_context =
      (config_.max_context_tokens + block - 1) / block * config_.num_layers;
  // Sharded, every rank sizes its pages as the rank with the most KV heads does (page bytes grow
  // with the heads: one format), so that all ranks have the same blocks.
  const int64_t sizing_page_bytes =
      shard_.sharded() ? page_bytes / config_.num_kv_heads * shard_.max_kv_heads : page_bytes;
  int64_t bytes = options_.cache_bytes.value_or(0);
  if (bytes == 0 && device_.is_cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    const c10::cuda::CUDAGuard guard(device_);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      return internal_error("cudaMemGetInfo failed");
    }
    bytes = static_cast<int64_t>(options_.gpu_memory_fraction.value_or(kDefaultMemoryFraction) *
                                 static_cast<double>(free_bytes));
  } else if (bytes == 0) {
    bytes = 4 * blocks_per_context * (shard_.sharded() ? sizing_page_bytes : block_bytes_);
  }
  int64_t num_pages = bytes / sizing_page_bytes;
  if (shard_.sharded() && device_.is_cuda()) {  // free memory differs per GPU: the least of them
    at::Tensor mine = at::full({1}, num_pages, at::TensorOptions().dtype(at::kLong).device(device_));
    at::Tensor all = at::empty({shard_.world_size}, mine.options());
    STRATA_RETURN_IF_ERROR(shard_.group->all_gather(mine, all));
    num_pages = all.min().item<int64_t>();
  }
  const int64_t num_blocks = num_pages * kv_geometry_.page_blocks;
  if (num_blocks < blocks_per_context) {
    return resource_exhausted_error(
        "a KV pool of " + std::to_string(bytes >> 20) + " MiB holds " +
        std::to_string(num_blocks) + " blocks; one full context of " +
        std::to_string(config_.max_context_tokens) + " tokens needs " +
        std::to_string(blocks_per_context));
  }
  const int64_t num_host_pages = options_.host_cache_bytes / sizing_page_bytes;
  if (num_pages * layout->max_blocks_per_page() > INT32_MAX ||
      num_host_pages * layout->max_blocks_per_page() > INT32_MAX) {
    return invalid_argument_error("KV pool has too many blocks");
  }
  kv_geometry_.num_blocks = static_cast<int32_t>(num_blocks);
  kv_geometry_.num_host_blocks = static_cast<int32_t>(num_host_pages * kv_geometry_.page_blocks);
  STRATA_ASSIGN_OR_RETURN(
      pool_, KvPool::allocate(std::move(layout).value(), num_pages, num_host_pages, device_, dtype_,
                              config_.num_kv_heads, block, config_.head_dim));
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

at::Tensor TorchExecutor::pool_part(const SequenceChunk& chunk, int64_t layer, int64_t end,
                                   int64_t part) {
  const int64_t block = kv_geometry_.block_size_tokens;
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < (end + block - 1) / block; ++j) {
    rows.push_back(pool_.layout().base_index(chunk.tables[layer][j]));
  }
  // [blocks, Hkv, B, D] -> [blocks * B, Hkv, D]
  const at::Tensor blocks =
      pool_.base_view().select(1, part).index_select(0, at::tensor(rows, at::kLong).to(device_));
  return blocks.permute({0, 2, 1, 3})
      .reshape({-1, config_.num_kv_heads, config_.head_dim})
      .narrow(0, 0, end);
}

void TorchExecutor::observe_prompts(const ForwardBatch& batch, int64_t layer, const at::Tensor& q,
                                    double scale, const PartialLayer* part) {
  int64_t row = 0;
  for (size_t s = 0; s < batch.chunks.size(); ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    if (part) row = part->chunk_rows[s];
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    const int64_t end = chunk.start_position + n;
    if (leankv_ && chunk.compress_kv && !leankv_->decoding(chunk.seq) &&
        (chunk.start_position == 0 || leankv_->observing(chunk.seq))) {
      leankv_->observe_prompt(chunk.seq, layer, q.narrow(0, row, n), pool_part(chunk, layer, end, 0),
                              chunk.start_position, scale);
    }
    if (freekv_ && chunk.compress_kv && (!chunk.layout || chunk.layout->is_default()) &&
        freekv_->observes(chunk.seq, chunk.start_position)) {
      freekv_->observe(chunk.seq, layer, q.narrow(0, row, n), pool_part(chunk, layer, end, 0),
                       chunk.start_position, scale);
    }
    row += n;
  }
}

void TorchExecutor::observe_attention(const ForwardBatch& batch, int64_t layer, const at::Tensor& q,
                                      double scale, const PartialLayer* part,
                                      const at::Tensor& decode_probs) {
  int64_t row = 0;
  for (size_t s = 0; s < batch.chunks.size(); ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    if (part) row = part->chunk_rows[s];
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    const int64_t stride = chunk.observe_row_stride;
    if (chunk.observe_attention &&
        AttentionObserver::observes_rows(chunk.start_position, n, stride)) {
      const int64_t end = chunk.start_position + n;
      if (n == 1 && decode_probs.defined()) {
        attention_observer_.observe_row(
            chunk.seq, layer, decode_probs.select(0, static_cast<int64_t>(s)).narrow(1, 0, end),
            chunk.start_position);
      } else {
        attention_observer_.observe(chunk.seq, layer, q.narrow(0, row, n),
                                    pool_part(chunk, layer, end, 0), chunk.start_position, scale,
                                    stride);
      }
    }
    row += n;
  }
}

StatusOr<ForwardResult> TorchExecutor::run(const ForwardBatch& batch) {
  c10::InferenceMode inference_mode;
  const int64_t num_seqs = static_cast<int64_t>(batch.chunks.size());
  const int64_t num_layers = config_.num_layers;
  const int64_t head_dim = config_.head_dim;
  const int64_t num_heads = config_.num_heads;
  const int64_t num_kv_heads = config_.num_kv_heads;
  const int64_t block = kv_geometry_.block_size_tokens;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);

  // Block moves, in StepCopies' order: a swap-in may land in a block a swap-out just vacated.
  const kv::StepCopies& copies = batch.copies;
  pool_.copy(copies.swap_out, KvPool::Side::kDevice, KvPool::Side::kHost);
  pool_.copy(copies.swap_in, KvPool::Side::kHost, KvPool::Side::kDevice);
  pool_.copy(copies.device, KvPool::Side::kDevice, KvPool::Side::kDevice);
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
  const kv::PageLayout& layout = pool_.layout();
  std::vector<bool> other_format(num_layers, false);  // per layer: some chunk's blocks are not base
  ForwardResult result;
  result.vocab_size = config_.vocab_size;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    const int64_t offset = static_cast<int64_t>(token_ids.size());
    const bool lean = decodes_from_pages(chunk);  // no pool blocks: its table rows stay unused
    result.row_offsets.push_back(static_cast<int64_t>(logit_rows.size()));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t position = chunk.start_position + i;
      token_ids.push_back(chunk.tokens[i]);
      positions.push_back(position);
      if (chunk.logits == LogitsMode::kAll || (chunk.logits == LogitsMode::kLast && i == n - 1)) {
        logit_rows.push_back(offset + i);
      }
      // Tokens whose layer is not on the kernels' base view, or shares another layer's blocks,
      // and LeanKV's decode tokens are not written by the cache-write kernel (slot -1).
      for (int64_t l = 0; l < num_layers; ++l) {
        // Krul: history rows a layer does not compute keep their loaded KV there.
        const bool computed = i >= chunk.restored_tokens || i < chunk.computed_rows[l];
        const bool base = !lean && computed && on_base_view(chunk, l) && !shares(chunk, l);
        slot_data[l * num_tokens + offset + i] =
            base ? layout.base_index(chunk.tables[l][position / block]) * block + position % block
                 : -1;
      }
    }
    const int64_t used_blocks = (chunk.start_position + n + block - 1) / block;
    for (int64_t l = 0; l < num_layers && !lean; ++l) {
      if (!on_base_view(chunk, l)) {
        other_format[l] = true;  // this layer's attention reads a dequantized copy
        continue;
      }
      for (int64_t j = 0; j < used_blocks; ++j) {
        table_data[(l * num_seqs + s) * max_blocks + j] =
            static_cast<int32_t>(layout.base_index(chunk.tables[l][j]));
      }
    }
    seq_lens.push_back(static_cast<int32_t>(chunk.start_position + n));
    cu_q_lens.push_back(cu_q_lens.back() + static_cast<int32_t>(n));
  }
  result.row_offsets.push_back(static_cast<int64_t>(logit_rows.size()));

  // LeanKV: sequences whose prompt was compressed decode from its pages (one token each); the
  // others run paged attention over the pool as a sub-batch.
  std::vector<SeqId> lean_seqs;
  std::vector<int64_t> lean_positions, lean_rows, dense_rows, dense_seqs;
  std::vector<int32_t> dense_cu_q_lens = {0};
  for (int64_t s = 0, row = 0; s < num_seqs; ++s) {
    const SequenceChunk& chunk = batch.chunks[s];
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    if (chunk.start_position == 0) {  // starts over
      if (leankv_) leankv_->end(chunk.seq);
      if (freekv_) freekv_->end(chunk.seq);
    }
    if (decodes_from_pages(chunk)) {
      if (n != 1) {
        return invalid_argument_error("sequence " + std::to_string(chunk.seq.value) +
                                      " decodes off the KV pool: one token per chunk, got " +
                                      std::to_string(n));
      }
      lean_seqs.push_back(chunk.seq);
      lean_positions.push_back(chunk.start_position);
      lean_rows.push_back(row);
    } else {
      for (int64_t i = 0; i < n; ++i) dense_rows.push_back(row + i);
      dense_seqs.push_back(s);
      dense_cu_q_lens.push_back(dense_cu_q_lens.back() + static_cast<int32_t>(n));
    }
    row += n;
  }
  at::Tensor lean_rows_t, dense_rows_t, dense_seqs_t, dense_seq_lens_t, dense_cu_q_lens_t;
  if (!lean_seqs.empty()) {
    lean_rows_t = at::tensor(lean_rows, long_opts).to(device_);
    dense_rows_t = at::tensor(dense_rows, long_opts).to(device_);
    dense_seqs_t = at::tensor(dense_seqs, long_opts).to(device_);
    dense_cu_q_lens_t = at::tensor(dense_cu_q_lens, at::kInt).to(device_);
  }

  at::Tensor ids = at::tensor(token_ids, long_opts).to(device_);
  at::Tensor pos = at::tensor(positions, long_opts).to(device_);
  const at::Tensor host_tables = tables, host_slots = slots;
  tables = tables.to(device_);
  slots = slots.to(device_);
  at::Tensor seq_lens_t = at::tensor(seq_lens, at::kInt).to(device_);
  at::Tensor cu_q_lens_t = at::tensor(cu_q_lens, at::kInt).to(device_);
  if (!lean_seqs.empty()) dense_seq_lens_t = seq_lens_t.index_select(0, dense_seqs_t);
  const RotaryTables rope = make_rotary_tables(pos, inv_freq_, dtype_);
  const std::vector<PartialLayer> partial = partial_layers(batch, host_tables, host_slots, rope);
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

  const bool observes = std::any_of(batch.chunks.begin(), batch.chunks.end(),
                                    [](const SequenceChunk& c) { return c.observe_attention; });
  // Krul's decode rows this step, if any: the CPU decode kernel hands them over (its probs).
  const bool observes_decode =
      std::any_of(batch.chunks.begin(), batch.chunks.end(), [](const SequenceChunk& c) {
        return c.observe_attention && c.tokens.size() == 1 &&
               AttentionObserver::observes_rows(c.start_position, 1, c.observe_row_stride);
      });
  STRATA_ASSIGN_OR_RETURN(at::Tensor x, embed(ids));  // [num_tokens, hidden]
  for (int64_t l = 0; l < num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    if (!loads.sources.empty()) {
      const auto start = std::chrono::steady_clock::now();
      insert_loaded_layer(loads, l);
      result.load_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    // Krul: a layer that computes only some rows runs on those (partial_layers).
    const PartialLayer* part = partial.empty() || !partial[l].rows.defined() ? nullptr : &partial[l];
    at::Tensor xl = part ? x.index_select(0, part->rows) : x;
    const int64_t rows = xl.size(0);
    const RotaryTables& rope_l = part ? part->rope : rope;
    at::Tensor h = kernels::rms_norm(xl, w.attn_norm, config_.rms_norm_eps, norm);
    const at::Tensor qkv = w.w_qkv.apply(h, w.b_qkv);  // [rows, (H + 2 Hkv) * D]
    const int64_t q_width = num_heads * head_dim, kv_width = num_kv_heads * head_dim;
    at::Tensor q = qkv.narrow(1, 0, q_width).contiguous().view({rows, num_heads, head_dim});
    at::Tensor k = qkv.narrow(1, q_width, kv_width).contiguous().view({rows, num_kv_heads, head_dim});
    at::Tensor v =
        qkv.narrow(1, q_width + kv_width, kv_width).contiguous().view({rows, num_kv_heads, head_dim});
    q = kernels::apply_rotary(q, rope_l.cos, rope_l.sin, rotary);
    k = kernels::apply_rotary(k, rope_l.cos, rope_l.sin, rotary);
    kernels::reshape_and_cache(pool_.base_view(), k, v, part ? part->slots : slots[l], cache_write);
    if (other_format[l]) write_other_formats(batch, l, k, v);
    if (!saves.destinations.empty()) {
      const auto start = std::chrono::steady_clock::now();
      save_layer(saves, l);
      result.save_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (leankv_ || freekv_) observe_prompts(batch, l, q, scale, part);
    at::Tensor attn;          // [tokens, H, D]
    at::Tensor decode_probs;  // [chunks, H, t] when the decode kernel wrote them
    if (!lean_seqs.empty()) {
      attn = at::empty({num_tokens, num_heads, head_dim}, q.options());
      if (!dense_seqs.empty()) {
        attn.index_copy_(
            0, dense_rows_t,
            kernels::paged_attention(q.index_select(0, dense_rows_t), pool_.base_view(),
                                     tables[l].index_select(0, dense_seqs_t), dense_seq_lens_t,
                                     dense_cu_q_lens_t, max_q_len, scale, attention));
      }
      const at::Tensor lean_q = q.index_select(0, lean_rows_t);
      const at::Tensor lean_k = k.index_select(0, lean_rows_t);
      const at::Tensor lean_v = v.index_select(0, lean_rows_t);
      if (leankv_) {
        attn.index_copy_(0, lean_rows_t,
                         leankv_->attend(lean_seqs, lean_positions, l, lean_q, lean_k, lean_v, scale));
        STRATA_RETURN_IF_ERROR(leankv_->settle(lean_seqs, lean_positions, l));
      } else {
        attn.index_copy_(0, lean_rows_t, freekv_->attend(lean_seqs, l, lean_q, lean_k, lean_v, scale));
      }
    } else if (part) {
      attn = kernels::paged_attention(q, pool_.base_view(), part->tables, part->seq_lens,
                                      part->cu_q_lens, part->max_q_len, scale, attention);
    } else {
      attn = other_format[l] ? attend_dequantized(batch, l, q, seq_lens_t, cu_q_lens_t, max_q_len,
                                                  scale, attention)
                             : kernels::paged_attention(q, pool_.base_view(), tables[l], seq_lens_t,
                                                        cu_q_lens_t, max_q_len, scale, attention,
                                                        observes_decode ? &decode_probs : nullptr);
    }
    if (observes) observe_attention(batch, l, q, scale, part, decode_probs);
    at::Tensor attn_out = w.wo.apply(attn.view({rows, num_heads * head_dim}));
    STRATA_RETURN_IF_ERROR(reduce_partial(attn_out));
    xl = xl + attn_out;

    h = kernels::rms_norm(xl, w.ffn_norm, config_.rms_norm_eps, norm);
    at::Tensor gate_up = w.w_gate_up.apply(h);
    const int64_t ffn = config_.intermediate_size;
    at::Tensor mlp_out =
        w.w_down.apply(at::silu(gate_up.narrow(1, 0, ffn)) * gate_up.narrow(1, ffn, ffn));
    STRATA_RETURN_IF_ERROR(reduce_partial(mlp_out));
    xl = xl + mlp_out;
    if (part) {
      x.index_copy_(0, part->rows, xl);
    } else {
      x = xl;
    }
  }

  // LeanKV: prompts that completed in this pass are compressed (a sequence that cannot be keeps
  // decoding from the pool, where its KV still is).
  if (leankv_) {
    for (const SequenceChunk& chunk : batch.chunks) {
      if (!chunk.samples || !leankv_->observing(chunk.seq)) continue;
      const int64_t end = chunk.start_position + static_cast<int64_t>(chunk.tokens.size());
      // A failure is counted (leankv_counts().failed_prompts); the sequence stays dense.
      const Status compressed = leankv_->compress(chunk.seq, end, [&](int64_t layer) {
        return std::pair{pool_part(chunk, layer, end, 0), pool_part(chunk, layer, end, 1)};
      });
      if (compressed.ok()) result.compressed.push_back(chunk.seq);
    }
  }

  // FreeKV: a sequence whose context reached the threshold in this pass leaves the pool.
  if (freekv_) {
    for (const SequenceChunk& chunk : batch.chunks) {
      const int64_t end = chunk.start_position + static_cast<int64_t>(chunk.tokens.size());
      if (!chunk.samples || !chunk.compress_kv || freekv_->decoding(chunk.seq) ||
          !freekv_->wants(end) || (chunk.layout && !chunk.layout->is_default())) {
        continue;
      }
      const bool started = freekv_->start(chunk.seq, end, [&](int64_t layer) {
        return std::pair{pool_part(chunk, layer, end, 0), pool_part(chunk, layer, end, 1)};
      });
      if (started) result.compressed.push_back(chunk.seq);
    }
  }

  if (observes)
    attention_observer_.after_pass(kernel_report_.backend(KernelOp::kKrulAccumulateRows));

  for (size_t i = 0; i < loads.failed.size(); ++i) {
    if (loads.failed[i]) result.failed_loads.push_back(batch.loads[i].seq);
  }
  result.load_copy_seconds = loads.copy_seconds + loads.insert_seconds;
  result.load_wait_seconds = loads.wait_seconds;
  for (int64_t l = 0; l < num_layers && !loads.sources.empty(); ++l) {
    result.load_copy_bytes += loads.layer_blocks[l] * block_bytes_;
  }
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
  STRATA_ASSIGN_OR_RETURN(at::Tensor logits, lm_logits(last));
  result.logits.assign(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel());
  return result;
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

StatusOr<std::unique_ptr<Executor>> Executor::create(const model::ModelSource& source,
                                                     const ExecutorOptions& options) {
  if (options.group != nullptr && options.group->world_size() > 1) {
    if (options.group->rank() != 0) {
      return invalid_argument_error("rank " + std::to_string(options.group->rank()) +
                                    " of a tensor-parallel group runs serve_tensor_parallel_rank");
    }
    return create_tensor_parallel(source, options);
  }
  auto executor = std::make_unique<TorchExecutor>(source.config(), options);
  STRATA_RETURN_IF_ERROR(executor->load(source));
  return std::unique_ptr<Executor>(std::move(executor));
}

}  // namespace strata::executor
