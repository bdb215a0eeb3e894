#include "hf_source.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "safetensors_file.h"
#include "xxhash.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// HF parameter name -> canonical (GGUF-style) name; empty if the name is not a model weight.
std::string canonical_name(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  if (auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  static const std::regex kLayerName(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(hf, m, kLayerName)) {
    if (auto it = kLayer.find(m[2].str()); it != kLayer.end()) {
      return "blk." + m[1].str() + "." + it->second;
    }
  }
  return {};
}

class HfSource final : public ModelSource {
 public:
  HfSource(std::string directory, ModelConfig config,
           std::vector<std::unique_ptr<SafetensorsFile>> files)
      : directory_(std::move(directory)), config_(std::move(config)), files_(std::move(files)) {}

  Status index_tensors() {
    for (const auto& file : files_) {
      for (const auto& [hf_name, tensor] : file->tensors()) {
        const std::string name = canonical_name(hf_name);
        if (name.empty()) continue;
        if (!index_.emplace(name, Entry{file.get(), &tensor}).second) {
          return invalid_argument_error(file->path() + ": tensor '" + hf_name +
                                        "' appears in more than one file");
        }
      }
    }
    // Some checkpoints tie the head without saying so in config.json.
    if (!index_.contains("output.weight")) config_.tied_embeddings = true;
    return Status();
  }

  const ModelConfig& config() const override { return config_; }
  const std::string& path() const override { return directory_; }
  bool has_weight(const std::string& name) const override { return index_.contains(name); }
  StatusOr<std::vector<int64_t>> weight_shape(const std::string& name) const override {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return not_found_error(directory_ + ": tensor '" + name + "' is missing");
    }
    return it->second.tensor->shape;
  }
  Status read_weight(const std::string& name, std::span<float> dst) const override {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return not_found_error(directory_ + ": tensor '" + name + "' is missing");
    }
    uint64_t num_elements = 1;
    for (int64_t d : it->second.tensor->shape) num_elements *= d;
    if (dst.size() != num_elements) {
      return invalid_argument_error(directory_ + ": tensor '" + name + "' has " +
                                    std::to_string(num_elements) +
                                    " elements, destination has " + std::to_string(dst.size()));
    }
    it->second.file->read_as_float(*it->second.tensor, dst);
    return Status();
  }
  StatusOr<Int4Weight> read_weight_int4(const std::string& name) const override {
    return unimplemented_error(directory_ + ": tensor '" + name +
                               "' is stored as floats, not 4-bit codes");
  }
  std::string weight_storage(const std::string& name) const override {
    auto it = index_.find(name);
    if (it == index_.end()) return {};
    switch (it->second.tensor->dtype) {
      case SafetensorsDtype::kF32:
        return "F32";
      case SafetensorsDtype::kF16:
        return "F16";
      case SafetensorsDtype::kBF16:
        return "BF16";
    }
    return {};
  }
  uint64_t content_fingerprint() const override {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    std::ifstream config(fs::path(directory_) / "config.json", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
    XXH3_64bits_update(state, text.data(), text.size());
    for (const auto& file : files_) {  // in file name order
      const std::span<const uint8_t> bytes = file->bytes();
      XXH3_64bits_update(state, bytes.data(), bytes.size());
    }
    const uint64_t digest = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return digest;
  }
  const GgufFile* gguf() const override { return nullptr; }
  std::string tokenizer_json_path() const override {
    return (fs::path(directory_) / "tokenizer.json").string();
  }

 private:
  struct Entry {
    const SafetensorsFile* file;
    const SafetensorsTensor* tensor;
  };
  std::string directory_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> index_;  // canonical name -> location
};

// Typed config.json access with errors that name the key.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  StatusOr<int64_t> get_int(const char* key) const {
    if (!j_.contains(key) || !j_[key].is_number_integer()) return missing(key, "an integer");
    return j_[key].get<int64_t>();
  }
  StatusOr<int64_t> get_int(const char* key, int64_t fallback) const {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    return get_int(key);
  }
  StatusOr<double> get_float(const char* key, double fallback) const {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    if (!j_[key].is_number()) return missing(key, "a number");
    return j_[key].get<double>();
  }

 private:
  Status missing(const char* key, const char* what) const {
    return invalid_argument_error(path_ + ": '" + key + "' must be " + what);
  }
  const json& j_;
  std::string path_;
};

Status read_rope_scaling(const json& scaling, const std::string& path, RopeConfig& rope) {
  if (scaling.is_null()) return Status();
  if (!scaling.is_object()) return invalid_argument_error(path + ": 'rope_scaling' must be an object");
  const std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
  auto number = [&](const char* key, double fallback) {
    return scaling.contains(key) && scaling[key].is_number() ? scaling[key].get<double>()
                                                             : fallback;
  };
  if (type == "default") return Status();
  if (type == "linear") {
    rope.scaling = RopeScalingType::kLinear;
    rope.factor = number("factor", 1.0);
    return Status();
  }
  if (type == "llama3") {
    rope.scaling = RopeScalingType::kLlama3;
    rope.factor = number("factor", 8.0);
    rope.low_freq_factor = number("low_freq_factor", 1.0);
    rope.high_freq_factor = number("high_freq_factor", 4.0);
    rope.original_max_positions =
        static_cast<int64_t>(number("original_max_position_embeddings", 8192));
    return Status();
  }
  return unimplemented_error(path + ": rope scaling type '" + type +
                             "' is not supported (default, linear, llama3)");
}

StatusOr<ModelConfig> read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found_error(path + ": cannot open");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument_error(path + ": not a JSON object");
  }
  const std::string model_type = j.value("model_type", std::string());
  ModelConfig c;
  if (model_type == "llama" || model_type == "mistral") {
    c.arch = Architecture::kLlama;
  } else if (model_type == "qwen2") {
    c.arch = Architecture::kQwen2;
    c.qkv_bias = true;
  } else {
    return unimplemented_error(path + ": unsupported model_type '" + model_type +
                               "' (supported: llama, mistral, qwen2)");
  }
  c.name = model_type;
  ConfigReader r(j, path);
  STRATA_ASSIGN_OR_RETURN(c.num_layers, r.get_int("num_hidden_layers"));
  STRATA_ASSIGN_OR_RETURN(c.hidden_size, r.get_int("hidden_size"));
  STRATA_ASSIGN_OR_RETURN(c.intermediate_size, r.get_int("intermediate_size"));
  STRATA_ASSIGN_OR_RETURN(c.num_heads, r.get_int("num_attention_heads"));
  STRATA_ASSIGN_OR_RETURN(c.num_kv_heads, r.get_int("num_key_value_heads", c.num_heads));
  STRATA_ASSIGN_OR_RETURN(c.vocab_size, r.get_int("vocab_size"));
  STRATA_ASSIGN_OR_RETURN(c.max_context_tokens, r.get_int("max_position_embeddings"));
  STRATA_ASSIGN_OR_RETURN(c.rms_norm_eps, r.get_float("rms_norm_eps", 1e-6));
  if (c.num_heads <= 0) return invalid_argument_error(path + ": 'num_attention_heads' must be positive");
  STRATA_ASSIGN_OR_RETURN(c.head_dim, r.get_int("head_dim", c.hidden_size / c.num_heads));
  c.rope.rotary_dim = c.head_dim;
  c.tied_embeddings = j.value("tie_word_embeddings", false);
  // transformers >= 5 nests rope settings under rope_parameters; older configs keep them flat.
  const json& rope_params = j.contains("rope_parameters") && j["rope_parameters"].is_object()
                                ? j["rope_parameters"]
                                : j;
  STRATA_ASSIGN_OR_RETURN(c.rope.theta, ConfigReader(rope_params, path).get_float("rope_theta", 10000.0));
  if (&rope_params != &j) {
    STRATA_RETURN_IF_ERROR(read_rope_scaling(rope_params, path, c.rope));
  } else if (j.contains("rope_scaling")) {
    STRATA_RETURN_IF_ERROR(read_rope_scaling(j["rope_scaling"], path, c.rope));
  }
  return c;
}

}  // namespace

StatusOr<std::unique_ptr<ModelSource>> open_hf_source(const std::string& directory) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config,
                          read_config((fs::path(directory) / "config.json").string()));
  std::vector<fs::path> paths;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors") paths.push_back(it->path());
  }
  if (ec) return not_found_error(directory + ": cannot list: " + ec.message());
  if (paths.empty()) return not_found_error(directory + ": no *.safetensors files");
  std::sort(paths.begin(), paths.end());
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (const fs::path& p : paths) {
    STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(p.string()));
    files.push_back(std::move(file));
  }
  auto source = std::make_unique<HfSource>(directory, std::move(config), std::move(files));
  STRATA_RETURN_IF_ERROR(source->index_tensors());
  return std::unique_ptr<ModelSource>(std::move(source));
}

}  // namespace strata::model
