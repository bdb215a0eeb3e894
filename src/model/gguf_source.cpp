#include "gguf_source.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "strata/model/dequantize.h"
#include "strata/model/gguf_file.h"
#include "xxhash.h"

namespace strata::model {
namespace {

class GgufSource final : public ModelSource {
 public:
  GgufSource(std::unique_ptr<GgufFile> file, ModelConfig config)
      : file_(std::move(file)), config_(std::move(config)) {}

  const ModelConfig& config() const override { return config_; }
  const std::string& path() const override { return file_->path(); }
  bool has_weight(const std::string& name) const override {
    return file_->find_tensor(name) != nullptr;
  }
  StatusOr<std::vector<int64_t>> weight_shape(const std::string& name) const override {
    STRATA_ASSIGN_OR_RETURN(const GgufTensorInfo* info, find(name));
    return std::vector<int64_t>(info->dims.rbegin(), info->dims.rend());
  }
  Status read_weight(const std::string& name, std::span<float> dst) const override;
  uint64_t content_fingerprint() const override {
    const std::span<const uint8_t> bytes = file_->bytes();
    return XXH3_64bits(bytes.data(), bytes.size());
  }
  const GgufFile* gguf() const override { return file_.get(); }
  std::string tokenizer_json_path() const override { return {}; }

 private:
  StatusOr<const GgufTensorInfo*> find(const std::string& name) const {
    const GgufTensorInfo* info = file_->find_tensor(name);
    if (info == nullptr) return not_found_error(path() + ": tensor '" + name + "' is missing");
    return info;
  }

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
};

Status GgufSource::read_weight(const std::string& name, std::span<float> dst) const {
  STRATA_ASSIGN_OR_RETURN(const GgufTensorInfo* info, find(name));
  if (static_cast<int64_t>(dst.size()) != info->num_elements) {
    return invalid_argument_error(path() + ": tensor '" + name + "' has " +
                                  std::to_string(info->num_elements) +
                                  " elements, destination has " + std::to_string(dst.size()));
  }
  const std::optional<GgmlTypeInfo> type = ggml_type_info(static_cast<uint32_t>(info->type));
  const int64_t row_len = info->dims[0];
  const int64_t num_rows = info->num_elements / row_len;
  const int64_t row_bytes = row_len / type->block_elements * type->block_bytes;
  const uint8_t* src = file_->tensor_data(*info);

  // Rows are independent: split them across threads.
  const int64_t num_threads = std::clamp<int64_t>(
      std::min<int64_t>(std::thread::hardware_concurrency(), num_rows * row_len / (1 << 16)), 1,
      16);
  std::vector<Status> statuses(num_threads);
  std::vector<std::thread> workers;
  const int64_t rows_per_thread = (num_rows + num_threads - 1) / num_threads;
  for (int64_t t = 0; t < num_threads; ++t) {
    workers.emplace_back([&, t] {
      const int64_t begin = t * rows_per_thread;
      const int64_t end = std::min(num_rows, begin + rows_per_thread);
      if (begin >= end) return;
      statuses[t] = dequantize_row(info->type, src + begin * row_bytes, (end - begin) * row_len,
                                   dst.data() + begin * row_len);
    });
  }
  for (std::thread& w : workers) w.join();
  for (const Status& s : statuses) {
    if (!s.ok()) return Status(s.code(), path() + ": tensor '" + name + "': " + s.message());
  }

  if (config_.arch == Architecture::kLlama) {
    const bool is_q = name.ends_with(".attn_q.weight");
    const bool is_k = name.ends_with(".attn_k.weight");
    if (is_q || is_k) {
      unpermute_rope_rows(dst, is_q ? config_.num_heads : config_.num_kv_heads, config_.head_dim,
                          row_len);
    }
  }
  return Status();
}

StatusOr<Architecture> parse_architecture(const GgufFile& file) {
  STRATA_ASSIGN_OR_RETURN(std::string arch, file.get_string("general.architecture"));
  if (arch == "llama") return Architecture::kLlama;
  if (arch == "qwen2") return Architecture::kQwen2;
  return unimplemented_error(file.path() + ": unsupported architecture '" + arch +
                             "' (supported: llama, qwen2)");
}

// Reads `key` if present, else returns `fallback`; a present key of the wrong type is an error.
StatusOr<int64_t> int_or(const GgufFile& f, const std::string& key, int64_t fallback) {
  if (!f.has_key(key)) return fallback;
  return f.get_int(key);
}
StatusOr<double> float_or(const GgufFile& f, const std::string& key, double fallback) {
  if (!f.has_key(key)) return fallback;
  return f.get_float(key);
}

StatusOr<ModelConfig> read_config(const GgufFile& f) {
  ModelConfig c;
  STRATA_ASSIGN_OR_RETURN(c.arch, parse_architecture(f));
  const std::string a = architecture_name(c.arch);
  if (f.has_key("general.name")) {
    STRATA_ASSIGN_OR_RETURN(c.name, f.get_string("general.name"));
  }
  STRATA_ASSIGN_OR_RETURN(c.num_layers, f.get_int(a + ".block_count"));
  STRATA_ASSIGN_OR_RETURN(c.hidden_size, f.get_int(a + ".embedding_length"));
  STRATA_ASSIGN_OR_RETURN(c.intermediate_size, f.get_int(a + ".feed_forward_length"));
  STRATA_ASSIGN_OR_RETURN(c.num_heads, f.get_int(a + ".attention.head_count"));
  STRATA_ASSIGN_OR_RETURN(c.num_kv_heads, int_or(f, a + ".attention.head_count_kv", c.num_heads));
  STRATA_ASSIGN_OR_RETURN(c.max_context_tokens, f.get_int(a + ".context_length"));
  STRATA_ASSIGN_OR_RETURN(c.rms_norm_eps, f.get_float(a + ".attention.layer_norm_rms_epsilon"));
  if (c.num_heads <= 0) {
    return invalid_argument_error(f.path() + ": " + a + ".attention.head_count must be positive");
  }
  STRATA_ASSIGN_OR_RETURN(c.head_dim,
                          int_or(f, a + ".attention.key_length", c.hidden_size / c.num_heads));
  STRATA_ASSIGN_OR_RETURN(c.rope.theta, float_or(f, a + ".rope.freq_base", 10000.0));
  STRATA_ASSIGN_OR_RETURN(c.rope.rotary_dim, int_or(f, a + ".rope.dimension_count", c.head_dim));

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) {
    return not_found_error(f.path() + ": tensor 'token_embd.weight' is missing");
  }
  if (embd->dims.size() != 2) {
    return invalid_argument_error(f.path() + ": tensor 'token_embd.weight' must be 2-D");
  }
  STRATA_ASSIGN_OR_RETURN(c.vocab_size, int_or(f, a + ".vocab_size", embd->dims[1]));
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.qkv_bias = c.arch == Architecture::kQwen2;

  // RoPE scaling: explicit per-frequency factors (Llama 3.1 GGUFs) or a metadata scaling type.
  if (const GgufTensorInfo* freqs = f.find_tensor("rope_freqs.weight")) {
    if (freqs->type != GgmlType::kF32 || freqs->dims.size() != 1) {
      return invalid_argument_error(f.path() + ": tensor 'rope_freqs.weight' must be 1-D F32");
    }
    // memcpy: with a general.alignment below 4 the data need not be float-aligned.
    c.rope.scaling = RopeScalingType::kFreqFactors;
    c.rope.freq_factors.resize(freqs->num_elements);
    std::memcpy(c.rope.freq_factors.data(), f.tensor_data(*freqs),
                c.rope.freq_factors.size() * sizeof(float));
  } else if (f.has_key(a + ".rope.scaling.type")) {
    STRATA_ASSIGN_OR_RETURN(std::string type, f.get_string(a + ".rope.scaling.type"));
    if (type == "linear") {
      c.rope.scaling = RopeScalingType::kLinear;
      STRATA_ASSIGN_OR_RETURN(c.rope.factor, f.get_float(a + ".rope.scaling.factor"));
    } else if (type != "none") {
      return unimplemented_error(f.path() + ": " + a + ".rope.scaling.type '" + type +
                                 "' is not supported (supported: none, linear, rope_freqs)");
    }
  }
  return c;
}

}  // namespace

void unpermute_rope_rows(std::span<float> weight, int64_t num_heads, int64_t head_dim,
                         int64_t row_len) {
  std::vector<float> head(head_dim * row_len);
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* base = weight.data() + h * head_dim * row_len;
    std::copy(base, base + head_dim * row_len, head.begin());
    for (int64_t j = 0; j < half; ++j) {
      for (int64_t t = 0; t < 2; ++t) {
        std::copy_n(head.data() + (2 * j + t) * row_len, row_len,
                    base + (t * half + j) * row_len);
      }
    }
  }
}

StatusOr<std::unique_ptr<ModelSource>> open_gguf_source(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, read_config(*file));
  return std::unique_ptr<ModelSource>(new GgufSource(std::move(file), std::move(config)));
}

}  // namespace strata::model
