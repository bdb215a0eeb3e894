// The engine and its KV store on the real default model, float32 on the CPU: the conversation
// the store tests resume (EngineStoreTest: a 200-token history, the model's reply, a 37-token
// next turn, each turn run by a store-less engine for reference) and the helpers that run and
// compare turns. Shared by engine_store_test and engine_store_codecs_test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "strata/engine/engine.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"
#include "support/temp_dir.h"

namespace strata::engine {


inline constexpr double kTieTolerance = 1e-3;
inline constexpr double kLogprobTolerance = 2e-3;
inline constexpr int kNewTokens = 16;
// SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 64 dims x 4 bytes = 46,080 bytes per token.
// The smallest pool the executor accepts holds one full 8,192-token context.
inline constexpr int64_t kPoolBytes = int64_t{8192 + 64} * 46080;

struct Turn {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
  std::vector<double> top2_gaps;
  Usage usage;
};

inline EngineOptions options_with(std::optional<store::StoreConfig> store, bool prefix_caching) {
  EngineOptions options;
  options.executor.cache_bytes = kPoolBytes;
  options.executor.enable_prefix_caching = prefix_caching;
  options.kv_store = store.value_or(store::StoreConfig{});
  return options;
}

inline StatusOr<std::unique_ptr<Engine>> try_make_engine(const EngineOptions& options,
                                                  const std::string& model = STRATA_TEST_MODEL) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelSource> source,
                          model::open_model_source(model));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                          tokenizer::Tokenizer::from_gguf(*source->gguf()));
  return Engine::create(std::move(source), std::move(tok), options);
}

inline std::unique_ptr<Engine> make_engine(const EngineOptions& options,
                                    const std::string& model = STRATA_TEST_MODEL) {
  StatusOr<std::unique_ptr<Engine>> engine = try_make_engine(options, model);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

inline store::StoreConfig store_options(const std::string& ssd_dir) {
  store::StoreConfig o;
  o.dram_bytes = 64 << 20;  // 91 chunks of 737,280 bytes
  if (!ssd_dir.empty()) {
    o.ssd_dir = ssd_dir;
    o.ssd_bytes = 128 << 20;
    o.ssd_file_bytes = 64 << 20;
  }
  return o;
}

// Submits a greedy turn of `new_tokens` tokens with the top-2 log-probabilities; read it with
// read_turn (several may run at once).
inline std::shared_ptr<RequestStream> start_turn(Engine& engine, std::vector<TokenId> prompt,
                                                 const std::string& session,
                                                 int new_tokens = kNewTokens) {
  GenerateRequest request;
  request.prompt_token_ids = std::move(prompt);
  request.session = session;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = new_tokens;
  request.sampling.ignore_eos = true;
  request.sampling.num_logprobs = 2;
  StatusOr<std::shared_ptr<RequestStream>> stream = engine.submit(std::move(request));
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  return stream.ok() ? *std::move(stream) : nullptr;
}

inline Turn read_turn(RequestStream* stream) {
  Turn turn;
  if (stream == nullptr) return turn;
  while (std::optional<RequestOutput> out = stream->next()) {
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

inline Turn run_turn(Engine& engine, std::vector<TokenId> prompt, const std::string& session,
                     int new_tokens = kNewTokens) {
  return read_turn(start_turn(engine, std::move(prompt), session, new_tokens).get());
}

inline void expect_same_as_recompute(const Turn& recompute, const Turn& resumed) {
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

// Waits (at most 5 s) until the engine's stats satisfy `done`; a failure names `what`. Store
// work (saves, re-encodings) and a request's end follow the stream's last output.
inline void wait_for(Engine& engine, const std::function<bool(const EngineStats&)>& done,
                     const std::string& what) {
  for (int i = 0; i < 500; ++i) {
    if (done(engine.stats())) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "timed out waiting for " << what;
}

// Waits until the store has published `saves` saves (turns): on CUDA a turn's chunks are
// published once its device-to-host copies are done, after the turn has ended.
inline void wait_for_saves(Engine& engine, int64_t saves) {
  wait_for(
      engine, [&](const EngineStats& s) { return s.store && s.store->tier("dram").saves >= saves; },
      "the store publishing " + std::to_string(saves) + " saves");
}

class EngineStoreTest : public ::testing::Test {
 protected:
  // The conversation: a 200-token history, the model's reply to it, then a 37-token next turn.
  // The engine keeps the KV of 200 + 16 - 1 = 215 computed tokens: 13 full blocks of 16.
 public:
  static constexpr int64_t kStoredTokens = 13 * 16;
  // One stored chunk of SmolLM2 (float32 pool): 30 layers x K and V x 3 KV heads x 16 tokens x 64.
  static constexpr int64_t kChunkBytes = 737280;

 protected:

  static void SetUpTestSuite() {
    recompute_engine_ = make_engine(options_with(std::nullopt, /*prefix_caching=*/false)).release();
    ASSERT_NE(recompute_engine_, nullptr);
    ASSERT_EQ(recompute_engine_->executor().kv_chunk_bytes(), kChunkBytes);
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

 public:
  static const std::vector<TokenId>& second_prompt() { return *second_prompt_; }
  // n_tokens tokens of WikiText-2's test text from its character skip_chars on.
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
    wait_for_saves(engine, 1);
  }

 protected:
  static inline Engine* recompute_engine_ = nullptr;
  static inline std::vector<TokenId>* history_ = nullptr;
  static inline std::vector<TokenId>* first_reply_ = nullptr;
  static inline std::vector<TokenId>* second_prompt_ = nullptr;
  static inline Turn* recomputed_second_ = nullptr;
};

}  // namespace strata::engine
