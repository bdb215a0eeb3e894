// The sampling defaults `strata serve`, `generate` and `chat` give requests: the model's own (a
// GGUF's general.sampling.* metadata, written here with the GGUF test writer, or an HF directory's
// generation_config.json) laid over the deployment file's sampling section, unless
// use_generation_config is false; and the line that logs them.
#include "sampling_defaults.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>

#include "unit/model/gguf_test_writer.h"

namespace strata::cli {
namespace {

using model::test_util::GgufWriter;
using model::test_util::TempDir;

class SamplingDefaultsTest : public ::testing::Test {
 protected:
  // A metadata-only GGUF (the defaults read nothing else) with `writer`'s keys, in a new file.
  std::unique_ptr<model::GgufFile> gguf(GgufWriter writer) {
    writer.add_string("general.architecture", "llama");
    const std::string path = dir_.file("model" + std::to_string(num_files_++) + ".gguf");
    model::test_util::write_file(path, writer.bytes());
    StatusOr<std::unique_ptr<model::GgufFile>> file = model::GgufFile::open(path);
    EXPECT_TRUE(file.ok()) << file.status().to_string();
    return file.ok() ? std::move(file).value() : nullptr;
  }
  void generation_config(std::string_view json) {
    model::test_util::write_text(dir_.file("generation_config.json"), json);
  }
  // The deployment file's section: what configs/default.yaml sets.
  static config::SamplingSection deployment() {
    config::SamplingSection s;
    s.temperature = 0.8;
    s.top_k = 40;
    s.top_p = 0.95;
    s.min_p = 0.05;
    return s;
  }

  TempDir dir_;
  int num_files_ = 0;
};

// llama.cpp's keys as its converter writes them (f32, top_k as i32).
GgufWriter with_sampling_keys() {
  GgufWriter w;
  w.add_f32("general.sampling.temp", 0.6f);
  w.add_i32("general.sampling.top_k", 20);
  w.add_f32("general.sampling.top_p", 0.5f);
  w.add_f32("general.sampling.min_p", 0.25f);
  w.add_f32("general.sampling.penalty_repeat", 1.5f);
  return w;
}

TEST_F(SamplingDefaultsTest, GgufMetadataIsTheModelsDefaults) {
  std::unique_ptr<model::GgufFile> file = gguf(with_sampling_keys());
  ASSERT_NE(file, nullptr);
  StatusOr<sampling::SamplingDefaults> d = model_sampling_defaults(file.get(), "");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->temperature, 0.6f);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_EQ(d->top_p, 0.5f);
  EXPECT_EQ(d->min_p, 0.25f);
  EXPECT_EQ(d->repetition_penalty, 1.5f);
  EXPECT_FALSE(d->presence_penalty || d->frequency_penalty);
  // A GGUF without the keys has no defaults of its own; a generation_config.json beside it is
  // not read (a GGUF carries its own metadata).
  generation_config(R"({"temperature": 0.1})");
  std::unique_ptr<model::GgufFile> bare = gguf(GgufWriter());
  ASSERT_NE(bare, nullptr);
  d = model_sampling_defaults(bare.get(), dir_.path().string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(*d, sampling::SamplingDefaults{});
}

TEST_F(SamplingDefaultsTest, GenerationConfigIsTheModelsDefaults) {
  // What Qwen2.5's generation_config.json holds, plus fields the defaults do not take.
  generation_config(R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645],
                        "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8,
                        "top_k": 20, "min_p": 0, "transformers_version": "4.37.0"})");
  StatusOr<sampling::SamplingDefaults> d = model_sampling_defaults(nullptr, dir_.path().string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  sampling::SamplingDefaults want;
  want.temperature = 0.7;
  want.top_k = 20;
  want.top_p = 0.8;
  want.min_p = 0.0;
  want.repetition_penalty = 1.05;
  EXPECT_EQ(*d, want) << d->describe();
  // Values of other JSON types are ignored, as is a fractional top_k.
  generation_config(R"({"temperature": "hot", "top_k": 2.5, "top_p": null})");
  d = model_sampling_defaults(nullptr, dir_.path().string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(*d, sampling::SamplingDefaults{}) << d->describe();
}

TEST_F(SamplingDefaultsTest, NoGenerationConfigMeansNoModelDefaults) {
  StatusOr<sampling::SamplingDefaults> d = model_sampling_defaults(nullptr, dir_.path().string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(*d, sampling::SamplingDefaults{});
  StatusOr<sampling::SamplingDefaults> resolved =
      resolve_sampling_defaults(deployment(), nullptr, dir_.path().string());
  ASSERT_TRUE(resolved.ok()) << resolved.status().to_string();
  EXPECT_EQ(*resolved, static_cast<sampling::SamplingDefaults>(deployment()));
}

// Every field the model sets replaces the deployment's; the others keep the deployment's.
TEST_F(SamplingDefaultsTest, ModelDefaultsOverrideTheDeployments) {
  config::SamplingSection section = deployment();
  section.presence_penalty = 0.5;
  generation_config(R"({"temperature": 0.3, "top_k": 5})");
  StatusOr<sampling::SamplingDefaults> d =
      resolve_sampling_defaults(section, nullptr, dir_.path().string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->temperature, 0.3);
  EXPECT_EQ(d->top_k, 5);
  EXPECT_EQ(d->top_p, 0.95);
  EXPECT_EQ(d->min_p, 0.05);
  EXPECT_EQ(d->presence_penalty, 0.5);
  EXPECT_FALSE(d->repetition_penalty || d->frequency_penalty);

  std::unique_ptr<model::GgufFile> file = gguf(with_sampling_keys());
  ASSERT_NE(file, nullptr);
  d = resolve_sampling_defaults(section, file.get(), "");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->temperature, 0.6f);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_EQ(d->top_p, 0.5f);
  EXPECT_EQ(d->min_p, 0.25f);
  EXPECT_EQ(d->repetition_penalty, 1.5f);
  EXPECT_EQ(d->presence_penalty, 0.5);
  // What requests then get for fields they leave unset.
  const sampling::SamplingParams params = d->params();
  EXPECT_EQ(params.temperature, 0.6f);
  EXPECT_EQ(params.top_k, 20);
  EXPECT_EQ(params.presence_penalty, 0.5);
  EXPECT_EQ(params.frequency_penalty, sampling::SamplingParams().frequency_penalty);
}

// use_generation_config: false keeps the deployment's section and reads nothing from the model,
// not even defaults it would reject.
TEST_F(SamplingDefaultsTest, UseGenerationConfigFalseIgnoresTheModel) {
  config::SamplingSection section = deployment();
  section.use_generation_config = false;
  generation_config(R"({"temperature": 0.3, "top_k": 5})");
  StatusOr<sampling::SamplingDefaults> d =
      resolve_sampling_defaults(section, nullptr, dir_.path().string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(*d, static_cast<sampling::SamplingDefaults>(deployment())) << d->describe();
  std::unique_ptr<model::GgufFile> file = gguf(with_sampling_keys());
  ASSERT_NE(file, nullptr);
  d = resolve_sampling_defaults(section, file.get(), "");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(*d, static_cast<sampling::SamplingDefaults>(deployment())) << d->describe();
  generation_config("[not json");
  EXPECT_TRUE(resolve_sampling_defaults(section, nullptr, dir_.path().string()).ok());
}

TEST_F(SamplingDefaultsTest, BadModelDefaultsAreErrors) {
  generation_config("[not json");
  EXPECT_EQ(model_sampling_defaults(nullptr, dir_.path().string()).status().code(),
            StatusCode::kDataLoss);
  generation_config(R"({"temperature": -1})");
  StatusOr<sampling::SamplingDefaults> d =
      resolve_sampling_defaults(deployment(), nullptr, dir_.path().string());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("the model's sampling defaults"), std::string::npos)
      << d.status().to_string();
  GgufWriter w;
  w.add_string("general.sampling.temp", "hot");
  std::unique_ptr<model::GgufFile> file = gguf(std::move(w));
  ASSERT_NE(file, nullptr);
  EXPECT_FALSE(model_sampling_defaults(file.get(), "").ok());
}

// The startup log names the model's defaults and the result.
TEST_F(SamplingDefaultsTest, ResultIsLogged) {
  std::ostringstream logged;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_st>(logged)));
  generation_config(R"({"temperature": 0.3})");
  config::SamplingSection section;
  section.top_k = 40;
  StatusOr<sampling::SamplingDefaults> d =
      resolve_sampling_defaults(section, nullptr, dir_.path().string());
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_NE(logged.str().find("the model's own defaults temperature=0.3"), std::string::npos)
      << logged.str();
  EXPECT_NE(logged.str().find("leave them unset: temperature=0.3 top_k=40"), std::string::npos)
      << logged.str();
}

}  // namespace
}  // namespace strata::cli
