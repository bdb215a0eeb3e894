// Tests for open_model_source() over GGUF files (HF directories: hf_source_test.cpp), and for
// RopeConfig::inverse_frequencies().
//
// The real-model tests read STRATA_TEST_MODEL (SmolLM2-135M-Instruct Q4_1) and skip without it.
// Everything else runs on tiny GGUF models written by the test through gguf_test_writer.h.
#include "strata/model/model_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gguf_test_writer.h"
#include "strata/model/dequantize.h"
#include "strata/model/gguf_file.h"
#include "strata/model/model_config.h"

namespace strata::model {
namespace {

using nlohmann::json;
using test_util::GgufWriter;
using test_util::product;
using test_util::status_is;
using test_util::synthetic_tensor;
using test_util::synthetic_value;
using test_util::TempDir;

// GGUF row h*D + 2j + t holds HF row h*D + t*D/2 + j (the `llama` converter's Q/K interleave).
// Returns `gguf_rows` ([num_heads * head_dim, row_len], GGUF order) in HF order.
std::vector<float> to_hf_row_order(const std::vector<float>& gguf_rows, int64_t num_heads,
                                   int64_t head_dim, int64_t row_len) {
  std::vector<float> hf(gguf_rows.size());
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t j = 0; j < head_dim / 2; ++j) {
      for (int64_t t = 0; t < 2; ++t) {
        const int64_t gguf_row = h * head_dim + 2 * j + t;
        const int64_t hf_row = h * head_dim + t * head_dim / 2 + j;
        for (int64_t c = 0; c < row_len; ++c) {
          hf[hf_row * row_len + c] = gguf_rows[gguf_row * row_len + c];
        }
      }
    }
  }
  return hf;
}

// ---------------------------------------------------------------------------------------------
// Tiny synthetic GGUF models

struct TinyModel {
  std::string arch = "llama";
  int64_t num_layers = 2;
  int64_t hidden = 64;
  int64_t ffn = 96;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 16;
  int64_t vocab = 40;
  int64_t context = 128;
  bool with_output = false;                  // untied LM head
  std::set<std::string> omit_keys;           // metadata keys to leave out
  std::set<std::string> omit_tensors;        // tensors to leave out
  std::map<std::string, std::vector<int64_t>> shapes;  // shape overrides, outermost first
  std::function<void(GgufWriter&)> extra;    // more metadata

  // Tensors in torch order (outermost first), as the model needs them.
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors() const {
    const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
    std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
        {"token_embd.weight", {vocab, hidden}}, {"output_norm.weight", {hidden}}};
    if (with_output) t.push_back({"output.weight", {vocab, hidden}});
    for (int64_t i = 0; i < num_layers; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      t.push_back({p + "attn_norm.weight", {hidden}});
      t.push_back({p + "attn_q.weight", {q, hidden}});
      t.push_back({p + "attn_k.weight", {kv, hidden}});
      t.push_back({p + "attn_v.weight", {kv, hidden}});
      t.push_back({p + "attn_output.weight", {hidden, q}});
      t.push_back({p + "ffn_norm.weight", {hidden}});
      t.push_back({p + "ffn_gate.weight", {ffn, hidden}});
      t.push_back({p + "ffn_up.weight", {ffn, hidden}});
      t.push_back({p + "ffn_down.weight", {hidden, ffn}});
      if (arch == "qwen2") {
        t.push_back({p + "attn_q.bias", {q}});
        t.push_back({p + "attn_k.bias", {kv}});
        t.push_back({p + "attn_v.bias", {kv}});
      }
    }
    for (auto& [name, shape] : t) {
      if (auto it = shapes.find(name); it != shapes.end()) shape = it->second;
    }
    return t;
  }

  std::vector<uint8_t> gguf_bytes() const {
    GgufWriter w;
    const std::string a = arch;
    auto key = [&](const std::string& k) { return !omit_keys.contains(k); };
    if (key("general.architecture")) w.add_string("general.architecture", a);
    w.add_string("general.name", "tiny");
    if (key(a + ".block_count")) w.add_u32(a + ".block_count", num_layers);
    if (key(a + ".embedding_length")) w.add_u32(a + ".embedding_length", hidden);
    if (key(a + ".feed_forward_length")) w.add_u32(a + ".feed_forward_length", ffn);
    if (key(a + ".attention.head_count")) w.add_u32(a + ".attention.head_count", heads);
    if (key(a + ".attention.head_count_kv")) w.add_u32(a + ".attention.head_count_kv", kv_heads);
    if (key(a + ".attention.key_length")) w.add_u32(a + ".attention.key_length", head_dim);
    if (key(a + ".context_length")) w.add_u64(a + ".context_length", context);
    if (key(a + ".attention.layer_norm_rms_epsilon")) {
      w.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
    }
    if (key(a + ".rope.freq_base")) w.add_f32(a + ".rope.freq_base", 50000.0f);
    if (extra) extra(w);
    for (const auto& [name, shape] : tensors()) {
      if (omit_tensors.contains(name)) continue;
      const std::vector<uint64_t> dims(shape.rbegin(), shape.rend());  // innermost first
      w.add_tensor(name, dims, test_util::kTypeF32,
                   test_util::f32_bytes(synthetic_tensor(name, shape)));
    }
    return w.bytes();
  }
};

class ModelSourceTest : public ::testing::Test {
 protected:
  StatusOr<std::unique_ptr<ModelSource>> open_tiny(const TinyModel& model) {
    path_ = dir_.file("tiny.gguf");
    test_util::write_file(path_, model.gguf_bytes());
    return open_model_source(path_);
  }

  TempDir dir_;
  std::string path_;
};

TEST_F(ModelSourceTest, TinyGgufConfigAndShapes) {
  TinyModel m;
  auto source = open_tiny(m);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  const ModelConfig& c = (*source)->config();
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 40);  // from token_embd.weight: no llama.vocab_size key
  EXPECT_EQ(c.max_context_tokens, 128);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), 1e-6f);
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_EQ(c.rope.rotary_dim, 16);
  EXPECT_EQ(c.rope.scaling, RopeScalingType::kNone);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ((*source)->path(), path_);
  EXPECT_NE((*source)->gguf(), nullptr);
  EXPECT_TRUE((*source)->tokenizer_json_path().empty());

  EXPECT_EQ((*source)->weight_shape("blk.1.attn_k.weight").value(),
            (std::vector<int64_t>{32, 64}));
  EXPECT_EQ((*source)->weight_shape("blk.0.ffn_down.weight").value(),
            (std::vector<int64_t>{64, 96}));
  EXPECT_EQ((*source)->weight_shape("token_embd.weight").value(),
            (std::vector<int64_t>{40, 64}));
  EXPECT_FALSE((*source)->has_weight("output.weight"));
  EXPECT_TRUE(status_is((*source)->weight_shape("output.weight").status(), StatusCode::kNotFound,
                        {"'output.weight'", path_}));
}

TEST_F(ModelSourceTest, UntiedOutputWeightIsDetected) {
  TinyModel m;
  m.with_output = true;
  auto source = open_tiny(m);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  EXPECT_FALSE((*source)->config().tied_embeddings);
  EXPECT_TRUE((*source)->has_weight("output.weight"));
}

TEST_F(ModelSourceTest, LlamaQAndKRowsAreUnpermutedOtherWeightsAreNot) {
  TinyModel m;
  auto source = open_tiny(m);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    int64_t num_heads;  // 0: not permuted
  };
  for (const Case& c : {Case{"blk.1.attn_q.weight", {64, 64}, 4},
                        Case{"blk.1.attn_k.weight", {32, 64}, 2},
                        Case{"blk.1.attn_v.weight", {32, 64}, 0},
                        Case{"blk.0.attn_output.weight", {64, 64}, 0},
                        Case{"blk.0.ffn_gate.weight", {96, 64}, 0}}) {
    SCOPED_TRACE(c.name);
    const std::vector<float> stored = synthetic_tensor(c.name, c.shape);
    const std::vector<float> expected =
        c.num_heads > 0 ? to_hf_row_order(stored, c.num_heads, 16, c.shape[1]) : stored;
    if (c.num_heads > 0) {
      ASSERT_NE(expected, stored);  // the permutation is not the identity
    }
    std::vector<float> actual(stored.size());
    ASSERT_TRUE((*source)->read_weight(c.name, actual).ok());
    EXPECT_EQ(actual, expected);
  }
  // Spot-check one row by hand: HF row 1 of head 0 (first half, j = 1) is GGUF row 2.
  std::vector<float> q(64 * 64);
  ASSERT_TRUE((*source)->read_weight("blk.1.attn_q.weight", q).ok());
  EXPECT_EQ(q[1 * 64 + 5], synthetic_value("blk.1.attn_q.weight", 2 * 64 + 5));
  // HF row 8 of head 0 (second half, j = 0) is GGUF row 1.
  EXPECT_EQ(q[8 * 64 + 5], synthetic_value("blk.1.attn_q.weight", 1 * 64 + 5));
}

TEST_F(ModelSourceTest, Qwen2RowsAreNotPermutedAndBiasesAreRequired) {
  TinyModel m;
  m.arch = "qwen2";
  auto source = open_tiny(m);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  EXPECT_EQ((*source)->config().arch, Architecture::kQwen2);
  EXPECT_TRUE((*source)->config().qkv_bias);
  const std::vector<float> stored = synthetic_tensor("blk.0.attn_q.weight", {64, 64});
  std::vector<float> actual(stored.size());
  ASSERT_TRUE((*source)->read_weight("blk.0.attn_q.weight", actual).ok());
  EXPECT_EQ(actual, stored);

  m.omit_tensors = {"blk.1.attn_v.bias"};
  auto missing = open_tiny(m);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(status_is(missing.status(), StatusCode::kNotFound, {"'blk.1.attn_v.bias'", path_}));
}

TEST_F(ModelSourceTest, ReadWeightErrors) {
  TinyModel m;
  auto source = open_tiny(m);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  std::vector<float> too_small(10);
  EXPECT_TRUE(status_is((*source)->read_weight("blk.0.attn_q.weight", too_small),
                        StatusCode::kInvalidArgument, {"'blk.0.attn_q.weight'", path_}));
  EXPECT_TRUE(status_is((*source)->read_weight("blk.9.attn_q.weight", too_small),
                        StatusCode::kNotFound, {"'blk.9.attn_q.weight'", path_}));
}

TEST_F(ModelSourceTest, UnsupportedArchitectureIsUnimplementedNamingIt) {
  TinyModel m;
  m.arch = "gpt2";
  auto source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kUnimplemented, {"'gpt2'", path_}));
}

TEST_F(ModelSourceTest, MissingTensorIsNotFoundNamingTensorAndFile) {
  TinyModel m;
  m.omit_tensors = {"blk.1.ffn_up.weight"};
  auto source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kNotFound, {"'blk.1.ffn_up.weight'", path_}));

  m.omit_tensors = {"token_embd.weight"};
  source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kNotFound, {"'token_embd.weight'", path_}));
}

TEST_F(ModelSourceTest, WrongShapeIsInvalidArgumentNamingTensorAndBothShapes) {
  TinyModel m;
  m.shapes = {{"blk.0.attn_k.weight", {24, 64}}};
  auto source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kInvalidArgument,
                        {"'blk.0.attn_k.weight'", "[24, 64]", "[32, 64]", path_}));

  m.shapes = {{"blk.1.ffn_norm.weight", {63}}};
  source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kInvalidArgument,
                        {"'blk.1.ffn_norm.weight'", "[63]", "[64]"}));
}

TEST_F(ModelSourceTest, MissingRequiredMetadataKeyIsNamed) {
  for (const std::string key :
       {"general.architecture", "llama.block_count", "llama.embedding_length",
        "llama.feed_forward_length", "llama.attention.head_count", "llama.context_length",
        "llama.attention.layer_norm_rms_epsilon"}) {
    SCOPED_TRACE(key);
    TinyModel m;
    m.omit_keys = {key};
    auto source = open_tiny(m);
    ASSERT_FALSE(source.ok());
    EXPECT_TRUE(status_is(source.status(), StatusCode::kNotFound, {"'" + key + "'", path_}));
  }
}

TEST_F(ModelSourceTest, OptionalMetadataKeysHaveDefaults) {
  TinyModel m;
  m.omit_keys = {"llama.attention.head_count_kv", "llama.attention.key_length",
                 "llama.rope.freq_base"};
  m.kv_heads = 4;  // head_count_kv defaults to head_count
  auto source = open_tiny(m);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  EXPECT_EQ((*source)->config().num_kv_heads, 4);
  EXPECT_EQ((*source)->config().head_dim, 16);  // hidden / heads
  EXPECT_EQ((*source)->config().rope.theta, 10000.0);
}

TEST_F(ModelSourceTest, WrongMetadataTypeIsInvalidArgumentNamingTheKey) {
  TinyModel m;
  m.omit_keys = {"llama.block_count"};
  m.extra = [](GgufWriter& w) { w.add_string("llama.block_count", "two"); };
  auto source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(
      status_is(source.status(), StatusCode::kInvalidArgument, {"'llama.block_count'", path_}));
}

TEST_F(ModelSourceTest, HeadsNotAMultipleOfKvHeadsIsInvalidArgument) {
  TinyModel m;
  m.heads = 6;
  m.kv_heads = 4;
  m.head_dim = 16;  // explicit key_length: 6 * 16 != hidden is allowed
  auto source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kInvalidArgument,
                        {"num_heads (6)", "num_kv_heads (4)", path_}));
}

TEST_F(ModelSourceTest, GgufRopeScalingMetadata) {
  TinyModel m;
  m.extra = [](GgufWriter& w) {
    w.add_string("llama.rope.scaling.type", "linear");
    w.add_f32("llama.rope.scaling.factor", 4.0f);
  };
  auto source = open_tiny(m);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  EXPECT_EQ((*source)->config().rope.scaling, RopeScalingType::kLinear);
  EXPECT_EQ((*source)->config().rope.factor, 4.0);

  m.extra = [](GgufWriter& w) { w.add_string("llama.rope.scaling.type", "yarn"); };
  source = open_tiny(m);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(status_is(source.status(), StatusCode::kUnimplemented, {"'yarn'", path_}));
}

TEST_F(ModelSourceTest, RopeFreqsTensorGivesPerFrequencyFactorsAtAnyAlignment) {
  // head_dim / 2 = 8 factors.
  const std::vector<float> factors = {1.0f, 1.0f, 2.0f, 2.5f, 4.0f, 8.0f, 8.0f, 16.0f};
  // general.alignment 1 and a padding key of 0..3 bytes put the data at every offset mod 4.
  for (size_t pad = 0; pad < 4; ++pad) {
    SCOPED_TRACE(pad);
    TinyModel m;
    m.extra = [&](GgufWriter& w) {
      w.set_alignment(1);
      w.add_u32("general.alignment", 1);
      w.add_string("pad", std::string(pad, 'p'));
      w.add_tensor("rope_freqs.weight", {8}, test_util::kTypeF32, test_util::f32_bytes(factors));
    };
    auto source = open_tiny(m);
    ASSERT_TRUE(source.ok()) << source.status().to_string();
    const RopeConfig& rope = (*source)->config().rope;
    EXPECT_EQ(rope.scaling, RopeScalingType::kFreqFactors);
    EXPECT_EQ(rope.freq_factors, factors);
  }
}

// ---------------------------------------------------------------------------------------------
// The real default model

class RealModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(STRATA_TEST_MODEL)) {
      GTEST_SKIP() << "model file " << STRATA_TEST_MODEL << " is absent";
    }
    auto source = open_model_source(STRATA_TEST_MODEL);
    ASSERT_TRUE(source.ok()) << source.status().to_string();
    source_ = std::move(source).value();
  }

  // The tensor dequantized straight from the file, rows in GGUF order.
  std::vector<float> dequantized_from_file(const std::string& name) {
    const GgufFile* file = source_->gguf();
    EXPECT_NE(file, nullptr);
    const GgufTensorInfo* info = file->find_tensor(name);
    EXPECT_NE(info, nullptr) << name;
    if (file == nullptr || info == nullptr) return {};
    std::vector<float> out(info->num_elements);
    Status status = dequantize_row(info->type, file->tensor_data(*info), info->num_elements,
                                   out.data());
    EXPECT_TRUE(status.ok()) << status.to_string();
    return out;
  }

  std::unique_ptr<ModelSource> source_;
};

TEST_F(RealModelTest, ConfigMatchesSmolLM2) {
  const ModelConfig& c = source_->config();
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_STREQ(architecture_name(c.arch), "llama");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context_tokens, 8192);
  EXPECT_EQ(c.rope.theta, 100000.0);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_EQ(c.rope.scaling, RopeScalingType::kNone);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), 1e-5f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(source_->has_weight("output.weight"));
  EXPECT_EQ(source_->weight_shape("token_embd.weight").value(),
            (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(source_->weight_shape("blk.29.attn_k.weight").value(),
            (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(source_->weight_shape("blk.0.ffn_down.weight").value(),
            (std::vector<int64_t>{576, 1536}));
}

TEST_F(RealModelTest, AttnQAndKAreTheUnpermutedDequantizedRows) {
  struct Case {
    std::string name;
    int64_t num_heads;
  };
  for (const Case& c : {Case{"blk.0.attn_q.weight", 9}, Case{"blk.0.attn_k.weight", 3}}) {
    SCOPED_TRACE(c.name);
    const std::vector<float> raw = dequantized_from_file(c.name);
    ASSERT_EQ(raw.size(), static_cast<size_t>(c.num_heads * 64 * 576));
    const std::vector<float> expected = to_hf_row_order(raw, c.num_heads, 64, 576);
    ASSERT_NE(expected, raw);
    std::vector<float> actual(raw.size());
    ASSERT_TRUE(source_->read_weight(c.name, actual).ok());
    // Same dequantization on both sides: bit-identical.
    EXPECT_EQ(std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)), 0);
  }
}

TEST_F(RealModelTest, OtherWeightsAreTheDequantizedRowsUnchanged) {
  for (const std::string name : {"blk.0.attn_v.weight", "blk.3.ffn_up.weight",
                                 "blk.0.attn_norm.weight", "token_embd.weight"}) {
    SCOPED_TRACE(name);
    const std::vector<float> raw = dequantized_from_file(name);
    std::vector<float> actual(raw.size());
    ASSERT_TRUE(source_->read_weight(name, actual).ok());
    EXPECT_EQ(std::memcmp(actual.data(), raw.data(), actual.size() * sizeof(float)), 0);
  }
}

// The 4-bit codes come in read_weight()'s row order (Q and K unpermuted like the floats) and
// give its values; weights stored otherwise are refused (the caller dequantizes them).
TEST_F(RealModelTest, Int4CodesAreTheReadWeightRowsAsCodes) {
  for (const std::string name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                 "blk.2.attn_v.weight", "blk.5.ffn_down.weight"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(source_->weight_storage(name), "Q4_1");
    StatusOr<Int4Weight> w = source_->read_weight_int4(name);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    std::vector<float> expected(w->rows * w->cols);
    ASSERT_TRUE(source_->read_weight(name, expected).ok());
    ASSERT_EQ(w->codes.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const size_t g = i / 32;
      ASSERT_NEAR(w->scale[g] * w->codes[i] + w->offset[g], expected[i], 1e-6f) << "element " << i;
    }
  }
  EXPECT_EQ(source_->weight_storage("token_embd.weight"), "Q8_0");
  EXPECT_EQ(source_->read_weight_int4("token_embd.weight").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(source_->weight_storage("blk.0.attn_norm.weight"), "F32");
  EXPECT_EQ(source_->weight_storage("no.such.weight"), "");
}

// ---------------------------------------------------------------------------------------------
// RoPE inverse frequencies

// Relative comparison at float32 precision.
::testing::AssertionResult near_rel(double actual, double expected, double rel = 2e-6) {
  if (std::fabs(actual - expected) <= rel * std::fabs(expected)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << actual << " vs expected " << expected;
}

TEST(RopeConfigTest, NoScalingIsInverseThetaPower) {
  RopeConfig rope;
  rope.theta = 100000.0;
  rope.rotary_dim = 64;
  const std::vector<float> inv = rope.inverse_frequencies();
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    EXPECT_TRUE(near_rel(inv[i], 1.0 / std::pow(100000.0, 2.0 * i / 64))) << i;
  }
  // Values of HF transformers' default RoPE (float32) for the same settings.
  EXPECT_EQ(inv[0], 1.0f);
  EXPECT_TRUE(near_rel(inv[1], 0.6978305578231812));
  EXPECT_TRUE(near_rel(inv[5], 0.16548170149326324));
  EXPECT_TRUE(near_rel(inv[16], 0.003162277862429619));  // 100000^-0.5
  EXPECT_TRUE(near_rel(inv[31], 1.4330126759887207e-05));
}

TEST(RopeConfigTest, LinearScalingDividesEveryFrequency) {
  RopeConfig rope;
  rope.theta = 100000.0;
  rope.rotary_dim = 64;
  rope.scaling = RopeScalingType::kLinear;
  rope.factor = 4.0;
  const std::vector<float> inv = rope.inverse_frequencies();
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_EQ(inv[0], 0.25f);
  EXPECT_TRUE(near_rel(inv[1], 0.1744576394557953));
  EXPECT_TRUE(near_rel(inv[5], 0.04137042537331581));
  EXPECT_TRUE(near_rel(inv[31], 3.582531689971802e-06));
}

TEST(RopeConfigTest, FreqFactorsDivideEachFrequency) {
  RopeConfig rope;
  rope.theta = 10000.0;
  rope.rotary_dim = 8;
  rope.scaling = RopeScalingType::kFreqFactors;
  rope.freq_factors = {1.0f, 2.0f, 4.0f, 8.0f};
  const std::vector<float> inv = rope.inverse_frequencies();
  ASSERT_EQ(inv.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(near_rel(inv[i], 1.0 / std::pow(10000.0, 2.0 * i / 8) / (1 << i))) << i;
  }
}

// Llama 3.1 settings (theta 500000, head_dim 128, factor 8, low 1, high 4, original context
// 8192), following transformers' `_compute_llama3_parameters`:
//   wavelen = 2*pi / f; high_freq_wavelen = 8192 / 4 = 2048; low_freq_wavelen = 8192 / 1 = 8192
//   wavelen < 2048:  f unchanged            (i <= 28)
//   wavelen > 8192:  f / 8                  (i >= 35)
//   otherwise:       s = (8192 / wavelen - 1) / (4 - 1);  (1 - s) * f / 8 + s * f
// e.g. i = 30: f = 500000^(-60/128) = 0.00213112, wavelen = 2948.28, s = 0.592849,
// f' = f * (0.407151 / 8 + 0.592849) = f * 0.643743 = 0.00137189.
// The expected values below are transformers' float32 results for these settings.
TEST(RopeConfigTest, Llama3ScalingMatchesTransformers) {
  RopeConfig rope;
  rope.theta = 500000.0;
  rope.rotary_dim = 128;
  rope.scaling = RopeScalingType::kLlama3;
  rope.factor = 8.0;
  rope.low_freq_factor = 1.0;
  rope.high_freq_factor = 4.0;
  rope.original_max_positions = 8192;
  const std::vector<float> inv = rope.inverse_frequencies();
  ASSERT_EQ(inv.size(), 64u);
  const std::pair<int, double> expected[] = {
      {0, 1.0},                       // high frequency: unchanged
      {10, 0.12868738174438477},      // unchanged
      {28, 0.0032114461064338684},    // unchanged, wavelen just below 2048
      {29, 0.0021665706299245358},    // smoothed
      {30, 0.0013718936825171113},    // smoothed
      {32, 0.0005248460220173001},    // smoothed
      {34, 0.0001785077911335975},    // smoothed
      {35, 9.556212171446532e-05},    // low frequency: divided by 8
      {63, 3.068925877869333e-07},    // divided by 8
  };
  for (const auto& [i, value] : expected) {
    EXPECT_TRUE(near_rel(inv[i], value)) << "i = " << i;
  }
  // The smoothing factor moves monotonically from 1 (unchanged) to 1/8 across the band.
  RopeConfig plain = rope;
  plain.scaling = RopeScalingType::kNone;
  const std::vector<float> base = plain.inverse_frequencies();
  for (int i = 29; i < 35; ++i) {
    const double ratio = inv[i] / base[i], next = inv[i + 1] / base[i + 1];
    EXPECT_LT(ratio, 1.0) << i;
    EXPECT_GT(ratio, next) << i;
  }
}

}  // namespace
}  // namespace strata::model
