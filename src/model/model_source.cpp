#include "strata/model/model_source.h"

#include <filesystem>

#include "gguf_source.h"
#include "hf_source.h"

namespace strata::model {

std::vector<ExpectedWeight> expected_weights(const ModelConfig& c) {
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  std::vector<ExpectedWeight> w = {
      {"token_embd.weight", {c.vocab_size, c.hidden_size}},
      {"output_norm.weight", {c.hidden_size}},
      {"output.weight", {c.vocab_size, c.hidden_size}, /*optional=*/c.tied_embeddings},
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    w.push_back({p + "attn_norm.weight", {c.hidden_size}});
    w.push_back({p + "attn_q.weight", {q_dim, c.hidden_size}});
    w.push_back({p + "attn_k.weight", {kv_dim, c.hidden_size}});
    w.push_back({p + "attn_v.weight", {kv_dim, c.hidden_size}});
    w.push_back({p + "attn_output.weight", {c.hidden_size, q_dim}});
    w.push_back({p + "ffn_norm.weight", {c.hidden_size}});
    w.push_back({p + "ffn_gate.weight", {c.intermediate_size, c.hidden_size}});
    w.push_back({p + "ffn_up.weight", {c.intermediate_size, c.hidden_size}});
    w.push_back({p + "ffn_down.weight", {c.hidden_size, c.intermediate_size}});
    if (c.qkv_bias) {
      w.push_back({p + "attn_q.bias", {q_dim}});
      w.push_back({p + "attn_k.bias", {kv_dim}});
      w.push_back({p + "attn_v.bias", {kv_dim}});
    }
  }
  return w;
}

namespace {

Status validate_weights(const ModelSource& source) {
  for (const ExpectedWeight& expected : expected_weights(source.config())) {
    if (!source.has_weight(expected.name)) {
      if (expected.optional) continue;
      return not_found_error(source.path() + ": tensor '" + expected.name + "' is missing");
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> shape, source.weight_shape(expected.name));
    if (shape != expected.shape) {
      auto fmt = [](const std::vector<int64_t>& s) {
        std::string out = "[";
        for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
        return out + "]";
      };
      return invalid_argument_error(source.path() + ": tensor '" + expected.name + "' has shape " +
                                    fmt(shape) + ", expected " + fmt(expected.shape));
    }
  }
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<ModelSource>> open_model_source(const std::string& path) {
  std::error_code ec;
  std::unique_ptr<ModelSource> source;
  if (std::filesystem::is_directory(path, ec)) {
    STRATA_ASSIGN_OR_RETURN(source, open_hf_source(path));
  } else {
    STRATA_ASSIGN_OR_RETURN(source, open_gguf_source(path));
  }
  Status status = source->config().validate();
  if (!status.ok()) return Status(status.code(), path + ": " + status.message());
  STRATA_RETURN_IF_ERROR(validate_weights(*source));
  return source;
}

}  // namespace strata::model
