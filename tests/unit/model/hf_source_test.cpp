// Tests for open_model_source() over HF directories: config.json plus hand-built .safetensors
// files (GGUF files: model_source_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gguf_test_writer.h"
#include "strata/model/model_config.h"
#include "strata/model/model_source.h"

namespace strata::model {
namespace {

using nlohmann::json;
using test_util::status_is;
using test_util::synthetic_tensor;
using test_util::TempDir;

// ---------------------------------------------------------------------------------------------
// HF directories

// A tensor for a hand-built .safetensors file.
struct StTensor {
  std::string name;
  std::string dtype;
  json shape;  // array of dims; json so that out-of-range dims can be written
  std::vector<uint8_t> data;
  std::optional<std::pair<uint64_t, uint64_t>> offsets = std::nullopt;  // default: actual range
};

// u64 header length, JSON header, data (see src/model/safetensors_file.h).
std::vector<uint8_t> safetensors_bytes(const std::vector<StTensor>& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<uint8_t> data;
  for (const StTensor& t : tensors) {
    const uint64_t begin = data.size();
    data.insert(data.end(), t.data.begin(), t.data.end());
    const auto offsets = t.offsets.value_or(std::make_pair(begin, uint64_t{data.size()}));
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offsets.first, offsets.second}}};
  }
  const std::string text = header.dump();
  test_util::ByteWriter out;
  out.put<uint64_t>(text.size());
  out.append(text.data(), text.size());
  out.append(data.data(), data.size());
  return out.bytes();
}

StTensor f32_tensor(const std::string& name, const std::vector<int64_t>& shape) {
  return {name, "F32", json(shape), test_util::f32_bytes(synthetic_tensor(name, shape))};
}

json tiny_hf_config(const std::string& model_type = "llama") {
  return {{"model_type", model_type}, {"num_hidden_layers", 1},         {"hidden_size", 64},
          {"intermediate_size", 96},  {"num_attention_heads", 4},       {"num_key_value_heads", 2},
          {"vocab_size", 40},         {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 20000.0},    {"tie_word_embeddings", true}};
}

// Every weight of tiny_hf_config(), F32, with HF names.
std::vector<StTensor> tiny_hf_tensors() {
  return {f32_tensor("model.embed_tokens.weight", {40, 64}),
          f32_tensor("model.norm.weight", {64}),
          f32_tensor("model.layers.0.input_layernorm.weight", {64}),
          f32_tensor("model.layers.0.self_attn.q_proj.weight", {64, 64}),
          f32_tensor("model.layers.0.self_attn.k_proj.weight", {32, 64}),
          f32_tensor("model.layers.0.self_attn.v_proj.weight", {32, 64}),
          f32_tensor("model.layers.0.self_attn.o_proj.weight", {64, 64}),
          f32_tensor("model.layers.0.post_attention_layernorm.weight", {64}),
          f32_tensor("model.layers.0.mlp.gate_proj.weight", {96, 64}),
          f32_tensor("model.layers.0.mlp.up_proj.weight", {96, 64}),
          f32_tensor("model.layers.0.mlp.down_proj.weight", {64, 96})};
}

class HfSourceTest : public ::testing::Test {
 protected:
  void write_config(const json& config) {
    test_util::write_text(dir_.path() / "config.json", config.dump());
  }
  void write_safetensors(const std::vector<StTensor>& tensors,
                         const std::string& name = "model.safetensors") {
    test_util::write_file(dir_.path() / name, safetensors_bytes(tensors));
  }
  std::string st_path(const std::string& name = "model.safetensors") const {
    return dir_.file(name);
  }
  StatusOr<std::unique_ptr<ModelSource>> open() { return open_model_source(dir_.path()); }

  TempDir dir_;
};

TEST_F(HfSourceTest, TinyDirectoryLoadsWithoutPermutingAndConvertsDtypes) {
  write_config(tiny_hf_config());
  std::vector<StTensor> tensors = tiny_hf_tensors();
  // The final norm in BF16 and the attention norm in F16: 1.5 and -2 are exact in both.
  tensors[1] = {"model.norm.weight", "BF16", json::array({64}), {}};
  tensors[2] = {"model.layers.0.input_layernorm.weight", "F16", json::array({64}), {}};
  for (int i = 0; i < 64; ++i) {
    const uint16_t bf16 = i % 2 == 0 ? 0x3FC0 : 0xC000;  // 1.5, -2
    const uint16_t f16 = i % 2 == 0 ? 0x3E00 : 0xC000;   // 1.5, -2
    tensors[1].data.push_back(bf16 & 0xFF);
    tensors[1].data.push_back(bf16 >> 8);
    tensors[2].data.push_back(f16 & 0xFF);
    tensors[2].data.push_back(f16 >> 8);
  }
  // Split across two files to exercise the directory scan.
  write_safetensors(std::vector<StTensor>(tensors.begin(), tensors.begin() + 4),
                    "model-00001-of-00002.safetensors");
  write_safetensors(std::vector<StTensor>(tensors.begin() + 4, tensors.end()),
                    "model-00002-of-00002.safetensors");

  auto source = open();
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  const ModelConfig& c = (*source)->config();
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.num_layers, 1);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.theta, 20000.0);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ((*source)->gguf(), nullptr);
  EXPECT_EQ((*source)->tokenizer_json_path(), (dir_.path() / "tokenizer.json").string());
  EXPECT_EQ((*source)->weight_shape("blk.0.attn_k.weight").value(), (std::vector<int64_t>{32, 64}));
  // Floats only: no 4-bit codes to keep (the executor dequantizes).
  EXPECT_EQ((*source)->weight_storage("blk.0.attn_q.weight"), "F32");
  EXPECT_EQ((*source)->weight_storage("output_norm.weight"), "BF16");
  EXPECT_EQ((*source)->weight_storage("no.such.weight"), "");
  EXPECT_TRUE(status_is((*source)->read_weight_int4("blk.0.attn_q.weight").status(),
                        StatusCode::kUnimplemented, {"blk.0.attn_q.weight", "not 4-bit codes"}));

  // HF checkpoints are already in HF row order: Q is returned as stored.
  const std::vector<float> q_stored =
      synthetic_tensor("model.layers.0.self_attn.q_proj.weight", {64, 64});
  std::vector<float> q(q_stored.size());
  ASSERT_TRUE((*source)->read_weight("blk.0.attn_q.weight", q).ok());
  EXPECT_EQ(q, q_stored);

  std::vector<float> norm(64), attn_norm(64);
  ASSERT_TRUE((*source)->read_weight("output_norm.weight", norm).ok());
  ASSERT_TRUE((*source)->read_weight("blk.0.attn_norm.weight", attn_norm).ok());
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(norm[i], i % 2 == 0 ? 1.5f : -2.0f) << i;
    EXPECT_EQ(attn_norm[i], i % 2 == 0 ? 1.5f : -2.0f) << i;
  }
}

TEST_F(HfSourceTest, UnknownModelTypeIsUnimplemented) {
  write_config(tiny_hf_config("gpt_neox"));
  write_safetensors(tiny_hf_tensors());
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kUnimplemented,
                        {"'gpt_neox'", (dir_.path() / "config.json").string()}));
}

TEST_F(HfSourceTest, MissingConfigJsonIsNotFound) {
  write_safetensors(tiny_hf_tensors());
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(
      status_is(source.status(), StatusCode::kNotFound, {(dir_.path() / "config.json").string()}));
}

TEST_F(HfSourceTest, MissingConfigFieldIsNamed) {
  json config = tiny_hf_config();
  config.erase("hidden_size");
  write_config(config);
  write_safetensors(tiny_hf_tensors());
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kInvalidArgument, {"'hidden_size'"}));
}

TEST_F(HfSourceTest, HeaderLengthBeyondTheFileIsDataLoss) {
  write_config(tiny_hf_config());
  const std::vector<uint8_t> full = safetensors_bytes(tiny_hf_tensors());
  // Keep the length field and 20 bytes of header: the declared header no longer fits.
  test_util::write_file(st_path(), std::vector<uint8_t>(full.begin(), full.begin() + 28));
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kDataLoss, {st_path(), "header length"}));

  // Shorter than the length field itself.
  test_util::write_file(st_path(), {1, 2, 3});
  source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kDataLoss, {st_path()}));
}

TEST_F(HfSourceTest, I64DtypeIsUnimplementedNamingTheTensor) {
  write_config(tiny_hf_config());
  std::vector<StTensor> tensors = tiny_hf_tensors();
  tensors.push_back(
      {"model.layers.0.positions", "I64", json::array({4}), std::vector<uint8_t>(32, 0)});
  write_safetensors(tensors);
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kUnimplemented,
                        {"'model.layers.0.positions'", "I64", st_path()}));
}

TEST_F(HfSourceTest, DataOffsetsBeyondTheFileAreDataLoss) {
  write_config(tiny_hf_config());
  std::vector<StTensor> tensors = tiny_hf_tensors();
  const uint64_t begin = 1 << 20;
  tensors[1].offsets = std::make_pair(begin, begin + 64 * 4);  // model.norm.weight
  write_safetensors(tensors);
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(
      status_is(source.status(), StatusCode::kDataLoss, {"'model.norm.weight'", st_path()}));
}

TEST_F(HfSourceTest, ShapeWhoseElementCountOverflowsIsRejected) {
  // 2^63 * 2 elements wraps to 0 in 64 bits, which would "match" an empty data range.
  write_config(tiny_hf_config());
  std::vector<StTensor> tensors = tiny_hf_tensors();
  tensors.push_back({"extra.huge", "F32", json::array({uint64_t{1} << 63, 2}), {}});
  write_safetensors(tensors);
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(
      status_is(source.status(), StatusCode::kInvalidArgument, {"'extra.huge'", st_path()}));
}

TEST_F(HfSourceTest, MissingWeightIsNotFoundNamingTheCanonicalTensor) {
  write_config(tiny_hf_config());
  std::vector<StTensor> tensors = tiny_hf_tensors();
  tensors.erase(tensors.begin() + 9);  // mlp.up_proj
  write_safetensors(tensors);
  auto source = open();
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kNotFound,
                        {"'blk.0.ffn_up.weight'", dir_.path().string()}));
}

}  // namespace
}  // namespace strata::model
