// The engine with its KV store (CachedAttention) on the real default model, float32 on the CPU
// (label: model).
//
// A conversation's second turn finds its history in the device pool's prefix cache, in the
// store's DRAM tier, or on SSD after the engine restarted, and must produce what computing the
// whole prompt produces: the same greedy tokens, each with a log-probability within
// kLogprobTolerance. A token may differ only where the recomputing run's top two log-probabilities
// are closer than kTieTolerance (the test checks that this is the reason and compares no
// further). A corrupt SSD chunk must be detected and counted, and the turn recomputed correctly.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "strata/engine/engine.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"
#include "support/temp_dir.h"

namespace strata::engine {
namespace {

constexpr double kTieTolerance = 1e-3;
constexpr double kLogprobTolerance = 2e-3;
constexpr int kNewTokens = 16;
// SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 64 dims x 4 bytes = 46,080 bytes per token.
// The smallest pool the executor accepts holds one full 8,192-token context.
constexpr int64_t kPoolBytes = int64_t{8192 + 64} * 46080;

struct Turn {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
  std::vector<double> top2_gaps;
  Usage usage;
};

EngineOptions options_with(std::optional<store::StoreOptions> store, bool prefix_caching) {
  EngineOptions options;
  options.executor.kv_cache_bytes = kPoolBytes;
  options.enable_prefix_caching = prefix_caching;
  options.store = std::move(store);
  return options;
}

std::unique_ptr<Engine> make_engine(const EngineOptions& options) {
  StatusOr<std::unique_ptr<model::ModelSource>> source =
      model::open_model_source(STRATA_TEST_MODEL);
  EXPECT_TRUE(source.ok()) << source.status().to_string();
  if (!source.ok()) return nullptr;
  StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::from_gguf(*(*source)->gguf());
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  if (!tok.ok()) return nullptr;
  StatusOr<std::unique_ptr<Engine>> engine =
      Engine::create(std::move(source).value(), std::move(tok).value(), options);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

store::StoreOptions store_options(const std::string& ssd_dir) {
  store::StoreOptions o;
  o.dram_bytes = 64 << 20;  // 91 chunks of 737,280 bytes
  o.ssd_dir = ssd_dir;
  o.ssd_bytes = ssd_dir.empty() ? 0 : 128 << 20;
  o.ssd_file_bytes = 64 << 20;
  return o;
}

Turn run_turn(Engine& engine, std::vector<TokenId> prompt, const std::string& session) {
  GenerateRequest request;
  request.prompt_token_ids = std::move(prompt);
  request.session = session;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = kNewTokens;
  request.sampling.ignore_eos = true;
  request.sampling.num_logprobs = 2;
  StatusOr<std::shared_ptr<RequestStream>> stream = engine.submit(std::move(request));
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  Turn turn;
  if (!stream.ok()) return turn;
  while (std::optional<RequestOutput> out = (*stream)->next()) {
    for (const TokenOutput& t : out->tokens) {
      turn.tokens.push_back(t.token);
      turn.logprobs.push_back(t.logprob);
      turn.top2_gaps.push_back(t.top_logprobs[0].logprob - t.top_logprobs[1].logprob);
    }
    if (out->finish_reason) {
      EXPECT_EQ(*out->finish_reason, FinishReason::kLength) << out->error;
      turn.usage = out->usage;
    }
  }
  return turn;
}

void expect_same_as_recompute(const Turn& recompute, const Turn& resumed) {
  ASSERT_EQ(resumed.tokens.size(), recompute.tokens.size());
  for (size_t i = 0; i < recompute.tokens.size(); ++i) {
    if (resumed.tokens[i] != recompute.tokens[i]) {
      ASSERT_LT(recompute.top2_gaps[i], kTieTolerance)
          << "token " << i << ": " << resumed.tokens[i] << " vs " << recompute.tokens[i]
          << " where recomputing gives a top-2 gap of " << recompute.top2_gaps[i];
      return;
    }
    EXPECT_NEAR(resumed.logprobs[i], recompute.logprobs[i], kLogprobTolerance) << "token " << i;
  }
}

// Waits until the store has published every pending save.
void wait_for_saves(Engine& engine, int64_t min_chunks) {
  for (int i = 0; i < 500; ++i) {
    const EngineStats stats = engine.stats();
    if (stats.store && stats.store->dram_chunks_used >= min_chunks) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the store never held " << min_chunks << " chunks";
}

class EngineStoreTest : public ::testing::Test {
 protected:
  // The conversation: a 200-token history, the model's reply to it, then a 37-token next turn.
  // The engine keeps the KV of 200 + 16 - 1 = 215 computed tokens: 13 full blocks of 16.
  static constexpr int64_t kStoredTokens = 13 * 16;

  static void SetUpTestSuite() {
    recompute_engine_ = make_engine(options_with(std::nullopt, /*prefix_caching=*/false)).release();
    ASSERT_NE(recompute_engine_, nullptr);
    history_ = new std::vector<TokenId>(wikitext(10000, 200));
    const Turn first = run_turn(*recompute_engine_, *history_, "");
    first_reply_ = new std::vector<TokenId>(first.tokens);
    second_prompt_ = new std::vector<TokenId>(*history_);
    second_prompt_->insert(second_prompt_->end(), first.tokens.begin(), first.tokens.end());
    const std::vector<TokenId> next = wikitext(50000, 37);
    second_prompt_->insert(second_prompt_->end(), next.begin(), next.end());
    recomputed_second_ = new Turn(run_turn(*recompute_engine_, *second_prompt_, ""));
  }
  static void TearDownTestSuite() {
    delete recompute_engine_;
    delete history_;
    delete first_reply_;
    delete second_prompt_;
    delete recomputed_second_;
  }

  static std::vector<TokenId> wikitext(size_t skip_chars, size_t n_tokens) {
    std::ifstream in(STRATA_SOURCE_DIR "/../shared/data/ppl/wikitext-2-raw-v1_test.raw");
    std::stringstream text;
    text << in.rdbuf();
    std::vector<TokenId> t =
        recompute_engine_->tokenizer().encode(text.str().substr(skip_chars, n_tokens * 8), false);
    EXPECT_GE(t.size(), n_tokens) << "WikiText-2 not found or too short";
    t.resize(std::min(t.size(), n_tokens));
    return t;
  }

  // Runs the first turn on `engine`; its reply must be the recomputing engine's.
  static void run_first_turn(Engine& engine, const std::string& session) {
    const Turn first = run_turn(engine, *history_, session);
    ASSERT_EQ(first.tokens, *first_reply_);
    wait_for_saves(engine, kStoredTokens / 16);
  }

  static inline Engine* recompute_engine_ = nullptr;
  static inline std::vector<TokenId>* history_ = nullptr;
  static inline std::vector<TokenId>* first_reply_ = nullptr;
  static inline std::vector<TokenId>* second_prompt_ = nullptr;
  static inline Turn* recomputed_second_ = nullptr;
};

TEST_F(EngineStoreTest, ResumedTurnFromDramMatchesRecompute) {
  std::unique_ptr<Engine> engine = make_engine(options_with(store_options(""), false));
  ASSERT_TRUE(engine);
  run_first_turn(*engine, "");  // stateless: found again by the content of its tokens
  const Turn second = run_turn(*engine, *second_prompt_, "");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.cached_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.cached_tier, "dram");
  expect_same_as_recompute(*recomputed_second_, second);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.store_loaded_tokens_dram, kStoredTokens);
  EXPECT_EQ(stats.store_loaded_tokens_ssd, 0);
  EXPECT_EQ(stats.store->dram.hits, 1);
}

TEST_F(EngineStoreTest, ResumedTurnFromTheDevicePoolMatchesRecompute) {
  std::unique_ptr<Engine> engine = make_engine(options_with(store_options(""), true));
  ASSERT_TRUE(engine);
  run_first_turn(*engine, "conversation");
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  // The prefix cache still holds the history: nothing is loaded from the store.
  EXPECT_EQ(second.usage.cached_tier, "gpu");
  EXPECT_EQ(second.usage.cached_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.loaded_prompt_tokens, 0);
  expect_same_as_recompute(*recomputed_second_, second);
}

TEST_F(EngineStoreTest, ResumedTurnFromSsdAfterARestartMatchesRecompute) {
  test_util::TempDir dir;
  {
    std::unique_ptr<Engine> engine = make_engine(options_with(store_options(dir.file("kv")), false));
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "conversation");
  }  // a clean shutdown writes DRAM-only items to SSD
  std::unique_ptr<Engine> engine = make_engine(options_with(store_options(dir.file("kv")), false));
  ASSERT_TRUE(engine);
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.cached_tier, "ssd");
  expect_same_as_recompute(*recomputed_second_, second);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.store_loaded_tokens_ssd, kStoredTokens);
  EXPECT_EQ(stats.store->ssd.hits, 1);
  EXPECT_EQ(stats.store->corrupt_chunks, 0);
  // The session's KV can be dropped; the next turn then computes its prompt.
  EXPECT_TRUE(engine->end_session("conversation"));
  EXPECT_FALSE(engine->end_session("conversation"));
}

TEST_F(EngineStoreTest, ACorruptSsdChunkIsCountedAndTheTurnRecomputed) {
  test_util::TempDir dir;
  {
    std::unique_ptr<Engine> engine = make_engine(options_with(store_options(dir.file("kv")), false));
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "conversation");
  }
  // Flip one byte in the middle of the stored chunks (the data file's first 13 x 737,280 bytes).
  const std::string data = dir.file("kv") + "/data-000.bin";
  ASSERT_TRUE(std::filesystem::exists(data));
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(5 * 737280 + 4321);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    f.seekp(5 * 737280 + 4321);
    f.write(&byte, 1);
  }
  std::unique_ptr<Engine> engine = make_engine(options_with(store_options(dir.file("kv")), false));
  ASSERT_TRUE(engine);
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, 0);
  EXPECT_EQ(second.usage.cached_prompt_tokens, 0);
  expect_same_as_recompute(*recomputed_second_, second);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.store_load_failures, 1);
  EXPECT_GE(stats.store->corrupt_chunks, 1);
}

}  // namespace
}  // namespace strata::engine
