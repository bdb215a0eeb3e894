// Grammars from JSON Schemas over the default model's real vocabulary: random walks through the
// token masks (the harshest "model": any allowed token, uniformly) always end in JSON that parses
// and has the schema's shape; masks refuse what the schema refuses; unsupported keywords are
// named. Validation against Python's jsonschema happens end to end (http_server_test.py).
#include "strata/sampling/grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "strata/model/gguf_file.h"
#include "strata/sampling/sampler.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::sampling {
namespace {

using Json = nlohmann::json;

class GrammarTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = model::GgufFile::open(STRATA_TEST_MODEL);
    ASSERT_TRUE(file.ok());
    auto tok = tokenizer::Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.ok());
    tokenizer_ = std::move(tok).value().release();
    std::vector<std::string> bytes(static_cast<size_t>(tokenizer_->vocab_size()));
    for (TokenId id = 0; id < tokenizer_->vocab_size(); ++id) {
      if (!tokenizer_->is_special(id)) bytes[static_cast<size_t>(id)] = tokenizer_->token_bytes(id);
    }
    table_ = new std::shared_ptr<const TokenTable>(
        std::make_shared<TokenTable>(std::move(bytes), tokenizer_->stop_ids()));
  }
  static void TearDownTestSuite() {
    delete table_;
    delete tokenizer_;
  }

  static std::shared_ptr<const Grammar> compile(const Json& schema) {
    auto g = Grammar::from_json_schema(schema.dump(), *table_);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? *g : nullptr;
  }

  // Draws allowed tokens at random (preferring short ones after a while, so the walk ends) until
  // a stop token; returns the text, or nullopt if it did not end within the step budget.
  static std::optional<std::string> walk(const std::shared_ptr<const Grammar>& g, uint64_t seed) {
    GrammarMatcher m(g);
    std::mt19937_64 rng(seed);
    std::string text;
    for (int step = 0; step < 400; ++step) {
      const std::shared_ptr<const TokenMask> mask = m.allowed_tokens();
      std::vector<TokenId> allowed;
      for (TokenId id = 0; id < (*table_)->vocab_size(); ++id) {
        if (mask_allows(*mask, id)) allowed.push_back(id);
      }
      EXPECT_FALSE(allowed.empty()) << "no token allowed after: " << text;
      if (allowed.empty()) return std::nullopt;
      const auto& stops = (*table_)->stop_ids();
      const bool can_stop = std::any_of(allowed.begin(), allowed.end(), [&](TokenId id) {
        return std::find(stops.begin(), stops.end(), id) != stops.end();
      });
      EXPECT_EQ(can_stop, m.complete()) << text;
      if (can_stop && (step > 40 || rng() % 4 == 0)) return text;
      if (step > 40) {  // wind down: the shortest allowed tokens close structures soonest
        std::stable_sort(allowed.begin(), allowed.end(), [&](TokenId a, TokenId b) {
          return (*table_)->bytes(a).size() < (*table_)->bytes(b).size();
        });
        const std::string closers = "\"}]0123456789eltrunf";
        std::vector<TokenId> short_ones;
        for (TokenId id : allowed) {
          const std::string& b = (*table_)->bytes(id);
          if (b.size() == 1 && closers.find(b[0]) != std::string::npos) short_ones.push_back(id);
        }
        if (!short_ones.empty()) allowed = short_ones;
      }
      TokenId pick = allowed[rng() % allowed.size()];
      if (std::find(stops.begin(), stops.end(), pick) != stops.end()) continue;
      EXPECT_TRUE(m.accept(pick));
      text += (*table_)->bytes(pick);
    }
    return std::nullopt;
  }

  static inline tokenizer::Tokenizer* tokenizer_ = nullptr;
  static inline std::shared_ptr<const TokenTable>* table_ = nullptr;
};

TEST_F(GrammarTest, RandomWalksEndInJsonOfTheSchemasShape) {
  const Json schema = Json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 12},
      "age": {"type": "integer"},
      "score": {"type": "number"},
      "kind": {"enum": ["cat", "dog", 3, null]},
      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
      "nickname": {"type": ["string", "null"]},
      "pet": {"$ref": "#/$defs/pet"}
    },
    "required": ["name", "age", "kind", "tags"],
    "additionalProperties": false,
    "$defs": {"pet": {"type": "object", "properties": {"legs": {"type": "integer"}},
                      "required": ["legs"], "additionalProperties": false}}
  })");
  const std::shared_ptr<const Grammar> g = compile(schema);
  ASSERT_NE(g, nullptr);
  int finished = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const std::optional<std::string> text = walk(g, seed);
    if (!text) continue;
    ++finished;
    const Json j = Json::parse(*text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << *text;
    ASSERT_TRUE(j.is_object()) << *text;
    for (const char* key : {"name", "age", "kind", "tags"}) EXPECT_TRUE(j.contains(key)) << *text;
    for (const auto& [key, value] : j.items())
      EXPECT_TRUE(schema["properties"].contains(key)) << *text;
    EXPECT_TRUE(j["age"].is_number_integer()) << *text;
    const std::string name = j["name"].get<std::string>();
    EXPECT_GE(name.size(), 1u);
    EXPECT_TRUE(j["kind"] == "cat" || j["kind"] == "dog" || j["kind"] == 3 || j["kind"].is_null());
    EXPECT_GE(j["tags"].size(), 1u);
    EXPECT_LE(j["tags"].size(), 3u);
    if (j.contains("pet")) {
      EXPECT_TRUE(j["pet"]["legs"].is_number_integer()) << *text;
    }
    if (j.contains("score")) {
      EXPECT_TRUE(j["score"].is_number()) << *text;
    }
  }
  EXPECT_GE(finished, 30);
}

TEST_F(GrammarTest, AnyJsonObjectAndRecursiveSchemas) {
  const auto object = Grammar::any_json_object(*table_);
  const Json tree = Json::parse(R"({"$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array",
      "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
      "$ref": "#/$defs/node"})");
  const auto recursive = compile(tree);
  ASSERT_NE(recursive, nullptr);
  int finished = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (const auto& g : {object, recursive}) {
      const std::optional<std::string> text = walk(g, seed);
      if (!text) continue;
      const Json j = Json::parse(*text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << *text;
      EXPECT_TRUE(j.is_object()) << *text;
      ++finished;
    }
  }
  EXPECT_GE(finished, 30);
}

TEST_F(GrammarTest, MasksRefuseWhatTheSchemaRefuses) {
  const auto g = compile(Json::parse(R"({"type": "object", "properties": {"ok": {"type":
      "boolean"}}, "required": ["ok"], "additionalProperties": false})"));
  ASSERT_NE(g, nullptr);
  GrammarMatcher m(g);
  auto id_of = [&](const std::string& text) {
    const std::vector<TokenId> ids = tokenizer_->encode(text, false);
    EXPECT_EQ(ids.size(), 1u) << text;
    return ids[0];
  };
  const TokenId brace = id_of("{");
  EXPECT_TRUE(mask_allows(*m.allowed_tokens(), brace));
  EXPECT_FALSE(mask_allows(*m.allowed_tokens(), id_of("[")));
  EXPECT_FALSE(mask_allows(*m.allowed_tokens(), id_of("Hello")));
  EXPECT_FALSE(m.accept(id_of("[")));
  ASSERT_TRUE(m.accept(brace));
  EXPECT_FALSE(m.complete());
  for (const char* piece : {"\"", "ok", "\":", " true"}) {
    for (TokenId id : tokenizer_->encode(piece, false)) ASSERT_TRUE(m.accept(id)) << piece;
  }
  EXPECT_FALSE(mask_allows(*m.allowed_tokens(), id_of(",")));  // no further property exists
  ASSERT_TRUE(m.accept(id_of("}")));
  EXPECT_TRUE(m.complete());
  // Complete, and nothing can follow: only the stop tokens are left.
  const std::shared_ptr<const TokenMask> end = m.allowed_tokens();
  for (TokenId id = 0; id < (*table_)->vocab_size(); ++id) {
    const auto& stops = (*table_)->stop_ids();
    const bool is_stop = std::find(stops.begin(), stops.end(), id) != stops.end();
    ASSERT_EQ(mask_allows(*end, id), is_stop) << id;
  }
}

TEST_F(GrammarTest, WrappedToolCallAndTheSampler) {
  auto g = Grammar::wrapped_json_schema(
      "<tool_call>\n",
      R"({"type": "object", "properties": {"name": {"const": "get_weather"},
          "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": false}},
          "required": ["name", "arguments"], "additionalProperties": false})",
      "\n</tool_call>", *table_);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  // Greedy sampling with the grammar, over logits that prefer '"' and '}' (and otherwise the
  // lowest id): the sampler draws only allowed tokens.
  SamplingParams params;
  params.temperature = 0;
  params.grammar = *g;
  SequenceSampler sampler(params, tokenizer_->vocab_size(), {});
  std::vector<float> logits(static_cast<size_t>(tokenizer_->vocab_size()), 0.0f);
  for (const char* preferred : {"\"", "}"}) {
    logits[static_cast<size_t>(tokenizer_->encode(preferred, false)[0])] = 5.0f;
  }
  std::string text;
  for (int step = 0; step < 200 && !sampler.grammar_complete(); ++step) {
    const TokenId t = sampler.sample(logits).token;
    sampler.accept(t);
    text += (*table_)->bytes(t);
  }
  ASSERT_TRUE(sampler.grammar_complete()) << text;
  ASSERT_EQ(text.rfind("<tool_call>\n", 0), 0u) << text;
  const size_t end = text.rfind("\n</tool_call>");
  ASSERT_NE(end, std::string::npos) << text;
  const Json call = Json::parse(text.substr(12, end - 12));
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_TRUE(call["arguments"]["city"].is_string());
}

TEST_F(GrammarTest, UnsupportedKeywordsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "string", "pattern": "^a"})", "json_schema.schema.pattern"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})",
       "json_schema.schema.properties.n.minimum"},
      {R"({"type": "thing"})", "json_schema.schema.type"},
      {R"({"$ref": "#/$defs/missing"})", "json_schema.schema.$ref"},
      {R"({"type": "object", "required": ["x"]})", "json_schema.schema.required"},
      {"not json", "not JSON"},
  };
  for (const auto& [schema, field] : cases) {
    auto g = Grammar::from_json_schema(schema, *table_);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(field), std::string::npos) << g.status().message();
  }
}

}  // namespace
}  // namespace strata::sampling
