// libtorch implementation of Executor: a Llama/Qwen2 decoder over variable-length batches.
//
// Tokens of all chunks are packed into one [num_tokens, hidden] activation so every projection
// and MLP runs as one matmul; attention runs per sequence against that sequence's KV cache.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "layers.h"
#include "strata/executor/executor.h"
#include "strata/model/model_source.h"

namespace strata::executor {
namespace {

at::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return at::kFloat;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat16: return at::kHalf;
  }
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

// KV cache of one sequence: per layer K and V of [kv_heads, capacity, head_dim]; positions
// [0, num_tokens) are valid. Keys are stored after RoPE.
struct SequenceCache {
  int64_t num_tokens = 0;
  int64_t capacity = 0;
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
};

class TorchExecutor final : public Executor {
 public:
  TorchExecutor(model::ModelConfig config, ExecutorOptions options)
      : config_(std::move(config)), options_(options) {}

  Status load(const model::ModelSource& source);

  const model::ModelConfig& config() const override { return config_; }
  const ExecutorOptions& options() const override { return options_; }
  StatusOr<ForwardResult> forward(const ForwardBatch& batch) override;
  void release(SeqId seq) override { caches_.erase(seq); }
  int64_t num_cached_tokens(SeqId seq) const override {
    auto it = caches_.find(seq);
    return it == caches_.end() ? 0 : it->second.num_tokens;
  }

 private:
  StatusOr<at::Tensor> load_weight(const model::ModelSource& source, const std::string& name);
  Status validate(const ForwardBatch& batch) const;
  ForwardResult run(const ForwardBatch& batch);
  void reserve(SequenceCache& cache, int64_t num_tokens);

  at::TensorOptions float_options() const {
    return at::TensorOptions().dtype(at::kFloat).device(device_);
  }

  model::ModelConfig config_;
  ExecutorOptions options_;
  at::Device device_ = at::kCPU;
  at::ScalarType dtype_ = at::kFloat;
  at::Tensor embedding_;    // [vocab, hidden]
  at::Tensor output_norm_;  // [hidden]
  at::Tensor lm_head_;      // [vocab, hidden]; aliases embedding_ when tied
  at::Tensor inv_freq_;     // [head_dim / 2], float32
  std::vector<LayerWeights> layers_;
  std::unordered_map<SeqId, SequenceCache> caches_;
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
  return Status();
}

Status TorchExecutor::validate(const ForwardBatch& batch) const {
  std::unordered_set<SeqId> seen;
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
    const int64_t total = num_cached_tokens(chunk.seq) + static_cast<int64_t>(chunk.tokens.size());
    if (total > config_.max_context_tokens) {
      return invalid_argument_error(seq + ": " + std::to_string(total) +
                                    " tokens exceed the context window of " +
                                    std::to_string(config_.max_context_tokens));
    }
  }
  return Status();
}

void TorchExecutor::reserve(SequenceCache& cache, int64_t num_tokens) {
  if (num_tokens <= cache.capacity) return;
  const int64_t capacity = std::min(config_.max_context_tokens,
                                    std::max({num_tokens, 2 * cache.capacity, int64_t{64}}));
  const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    at::Tensor k = at::empty({config_.num_kv_heads, capacity, config_.head_dim}, opts);
    at::Tensor v = at::empty_like(k);
    if (cache.num_tokens > 0) {
      k.narrow(1, 0, cache.num_tokens).copy_(cache.keys[l].narrow(1, 0, cache.num_tokens));
      v.narrow(1, 0, cache.num_tokens).copy_(cache.values[l].narrow(1, 0, cache.num_tokens));
    }
    if (cache.keys.size() < static_cast<size_t>(config_.num_layers)) {
      cache.keys.push_back(k);
      cache.values.push_back(v);
    } else {
      cache.keys[l] = k;
      cache.values[l] = v;
    }
  }
  cache.capacity = capacity;
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
  const int64_t num_chunks = static_cast<int64_t>(batch.chunks.size());
  const int64_t head_dim = config_.head_dim;
  const int64_t num_heads = config_.num_heads;
  const int64_t num_kv_heads = config_.num_kv_heads;

  // Pack tokens and positions of all chunks; note where each chunk starts.
  std::vector<int64_t> token_ids, positions, offsets, starts;
  std::vector<int64_t> logit_rows;  // packed token indices whose logits are returned
  ForwardResult result;
  result.vocab_size = config_.vocab_size;
  for (const SequenceChunk& chunk : batch.chunks) {
    SequenceCache& cache = caches_[chunk.seq];
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    reserve(cache, cache.num_tokens + n);
    offsets.push_back(static_cast<int64_t>(token_ids.size()));
    starts.push_back(cache.num_tokens);
    result.row_offsets.push_back(static_cast<int64_t>(logit_rows.size()));
    for (int64_t i = 0; i < n; ++i) {
      token_ids.push_back(chunk.tokens[i]);
      positions.push_back(cache.num_tokens + i);
      if (chunk.logits == LogitsMode::kAll ||
          (chunk.logits == LogitsMode::kLast && i == n - 1)) {
        logit_rows.push_back(offsets.back() + i);
      }
    }
  }
  result.row_offsets.push_back(static_cast<int64_t>(logit_rows.size()));
  const int64_t num_tokens = static_cast<int64_t>(token_ids.size());

  const auto index_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor ids = at::tensor(token_ids, index_opts).to(device_);
  at::Tensor pos = at::tensor(positions, index_opts).to(device_);
  const RotaryTables rope = make_rotary_tables(pos, inv_freq_, dtype_);

  at::Tensor x = at::embedding(embedding_, ids);  // [num_tokens, hidden]
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    at::Tensor h = rms_norm(x, w.attn_norm, config_.rms_norm_eps);
    at::Tensor q = at::linear(h, w.wq, w.bq).view({num_tokens, num_heads, head_dim});
    at::Tensor k = at::linear(h, w.wk, w.bk).view({num_tokens, num_kv_heads, head_dim});
    at::Tensor v = at::linear(h, w.wv, w.bv).view({num_tokens, num_kv_heads, head_dim});
    q = apply_rotary(q, rope);
    k = apply_rotary(k, rope);

    at::Tensor attn = at::empty({num_tokens, num_heads, head_dim}, q.options());
    for (int64_t c = 0; c < num_chunks; ++c) {
      SequenceCache& cache = caches_[batch.chunks[c].seq];
      const int64_t n = static_cast<int64_t>(batch.chunks[c].tokens.size());
      const int64_t start = starts[c];
      const int64_t context = start + n;
      cache.keys[l].narrow(1, start, n).copy_(k.narrow(0, offsets[c], n).transpose(0, 1));
      cache.values[l].narrow(1, start, n).copy_(v.narrow(0, offsets[c], n).transpose(0, 1));
      at::Tensor qc = q.narrow(0, offsets[c], n).transpose(0, 1).unsqueeze(0);  // [1, H, n, D]
      at::Tensor kc = cache.keys[l].narrow(1, 0, context).unsqueeze(0);         // [1, Hkv, ctx, D]
      at::Tensor vc = cache.values[l].narrow(1, 0, context).unsqueeze(0);
      at::Tensor out = causal_attention(qc, kc, vc, start);                     // [1, H, n, D]
      attn.narrow(0, offsets[c], n).copy_(out.squeeze(0).transpose(0, 1));
    }
    x = x + at::linear(attn.view({num_tokens, num_heads * head_dim}), w.wo);

    h = rms_norm(x, w.ffn_norm, config_.rms_norm_eps);
    at::Tensor gate_up = at::linear(h, w.w_gate_up);
    const int64_t ffn = config_.intermediate_size;
    x = x + at::linear(at::silu(gate_up.narrow(1, 0, ffn)) * gate_up.narrow(1, ffn, ffn),
                       w.w_down);
  }

  for (int64_t c = 0; c < num_chunks; ++c) {
    caches_[batch.chunks[c].seq].num_tokens =
        starts[c] + static_cast<int64_t>(batch.chunks[c].tokens.size());
  }
  if (logit_rows.empty()) return result;
  at::Tensor rows = at::tensor(logit_rows, index_opts).to(device_);
  at::Tensor last = rms_norm(x.index_select(0, rows), output_norm_, config_.rms_norm_eps);
  at::Tensor logits = at::linear(last, lm_head_).to(at::kCPU, at::kFloat).contiguous();
  result.logits.assign(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel());
  return result;
}

}  // namespace

StatusOr<DType> parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return DType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "float16" || name == "fp16") return DType::kFloat16;
  return invalid_argument_error("unknown dtype '" + name + "' (float32, bfloat16, float16)");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown";
}

StatusOr<Device> parse_device(const std::string& name) {
  if (name == "cpu") return Device{DeviceKind::kCpu, 0};
  if (name == "auto") {
    return c10::cuda::device_count() > 0 ? Device{DeviceKind::kCuda, 0}
                                          : Device{DeviceKind::kCpu, 0};
  }
  if (name == "cuda") return Device{DeviceKind::kCuda, 0};
  if (name.starts_with("cuda:")) {
    const std::string index = name.substr(5);
    if (!index.empty() && std::all_of(index.begin(), index.end(), ::isdigit) && index.size() < 4) {
      return Device{DeviceKind::kCuda, std::stoi(index)};
    }
  }
  return invalid_argument_error("unknown device '" + name + "' (cpu, cuda, cuda:N, auto)");
}

std::string device_name(const Device& device) {
  return device.kind == DeviceKind::kCpu ? "cpu" : "cuda:" + std::to_string(device.index);
}

StatusOr<std::unique_ptr<Executor>> Executor::create(const model::ModelSource& source,
                                                     const ExecutorOptions& options) {
  auto executor = std::make_unique<TorchExecutor>(source.config(), options);
  STRATA_RETURN_IF_ERROR(executor->load(source));
  return std::unique_ptr<Executor>(std::move(executor));
}

}  // namespace strata::executor
