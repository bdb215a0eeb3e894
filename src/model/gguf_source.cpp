#include "gguf_source.h"

#include <algorithm>
#include <cstring>
#include <optional>
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
  StatusOr<Int4Weight> read_weight_int4(const std::string& name) const override;
  std::string weight_storage(const std::string& name) const override {
    const GgufTensorInfo* info = file_->find_tensor(name);
    return info == nullptr ? std::string() : std::string(ggml_type_name(info->type));
  }
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

  // Q and K projection rows of the `llama` converter come interleaved (unpermute_rope_rows).
  std::optional<int64_t> rope_heads(const std::string& name) const {
    if (config_.arch != Architecture::kLlama) return std::nullopt;
    if (name.ends_with(".attn_q.weight")) return config_.num_heads;
    if (name.ends_with(".attn_k.weight")) return config_.num_kv_heads;
    return std::nullopt;
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

  if (const std::optional<int64_t> heads = rope_heads(name)) {
    unpermute_rope_rows(dst, *heads, config_.head_dim, row_len);
  }
  return Status();
}

StatusOr<Int4Weight> GgufSource::read_weight_int4(const std::string& name) const {
  STRATA_ASSIGN_OR_RETURN(const GgufTensorInfo* info, find(name));
  if (!has_int4_codes(info->type)) {
    return unimplemented_error(path() + ": tensor '" + name + "' is stored as " +
                               std::string(ggml_type_name(info->type)) + ", not 4-bit codes");
  }
  Int4Weight w;
  w.cols = info->dims[0];
  w.rows = info->num_elements / w.cols;
  w.codes.resize(info->num_elements);
  w.scale.resize(info->num_elements / kInt4CodeGroup);
  w.offset.resize(w.scale.size());
  STRATA_RETURN_IF_ERROR(decode_int4_codes(info->type, file_->tensor_data(*info),
                                           info->num_elements, w.codes.data(), w.scale.data(),
                                           w.offset.data()));
  if (const std::optional<int64_t> heads = rope_heads(name)) {
    unpermute_rope_rows(std::span<uint8_t>(w.codes), *heads, config_.head_dim, w.cols);
    unpermute_rope_rows(std::span<float>(w.scale), *heads, config_.head_dim,
                        w.cols / kInt4CodeGroup);
    unpermute_rope_rows(std::span<float>(w.offset), *heads, config_.head_dim,
                        w.cols / kInt4CodeGroup);
  }
  return w;
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

StatusOr<std::unique_ptr<ModelSource>> open_gguf_source(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, read_config(*file));
  return std::unique_ptr<ModelSource>(new GgufSource(std::move(file), std::move(config)));
}

}  // namespace strata::model
