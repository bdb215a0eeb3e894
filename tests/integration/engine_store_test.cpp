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

EngineOptions options_with(std::optional<store::StoreConfig> store, bool prefix_caching) {
  EngineOptions options;
  options.executor.cache_bytes = kPoolBytes;
  options.executor.enable_prefix_caching = prefix_caching;
  options.kv_store = store.value_or(store::StoreConfig{});
  return options;
}

StatusOr<std::unique_ptr<Engine>> try_make_engine(const EngineOptions& options,
                                                  const std::string& model = STRATA_TEST_MODEL) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelSource> source,
                          model::open_model_source(model));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                          tokenizer::Tokenizer::from_gguf(*source->gguf()));
  return Engine::create(std::move(source), std::move(tok), options);
}

std::unique_ptr<Engine> make_engine(const EngineOptions& options,
                                    const std::string& model = STRATA_TEST_MODEL) {
  StatusOr<std::unique_ptr<Engine>> engine = try_make_engine(options, model);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

store::StoreConfig store_options(const std::string& ssd_dir) {
  store::StoreConfig o;
  o.dram_bytes = 64 << 20;  // 91 chunks of 737,280 bytes
  if (!ssd_dir.empty()) {
    o.ssd_dir = ssd_dir;
    o.ssd_bytes = 128 << 20;
    o.ssd_file_bytes = 64 << 20;
  }
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

// Waits until the store has published `saves` saves (turns): on CUDA a turn's chunks are
// published once its device-to-host copies are done, after the turn has ended.
void wait_for_saves(Engine& engine, int64_t saves) {
  for (int i = 0; i < 500; ++i) {
    const EngineStats stats = engine.stats();
    if (stats.store && stats.store->tier("dram").saves >= saves) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the store never published " << saves << " saves";
}

class EngineStoreTest : public ::testing::Test {
 protected:
  // The conversation: a 200-token history, the model's reply to it, then a 37-token next turn.
  // The engine keeps the KV of 200 + 16 - 1 = 215 computed tokens: 13 full blocks of 16.
 public:
  static constexpr int64_t kStoredTokens = 13 * 16;

 protected:

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
 public:
  static const std::vector<TokenId>& second_prompt() { return *second_prompt_; }
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
  EXPECT_EQ(stats.loaded_tokens("dram"), kStoredTokens);
  EXPECT_EQ(stats.loaded_tokens("ssd"), 0);
  EXPECT_EQ(stats.store->tier("dram").hits, 1);
}

// Krul's restoration (kv_store.restore_mode): the resumed turn recomputes a prefix of its stored
// history at each layer and loads the rest, in the new turn's pass; the same answer as
// recomputing. partial at 0.5 (every layer recomputes 6 of the 13 blocks), at 1 (everything, no
// load), and krul (the pyramid from the measured costs, after a plain load measured them).
TEST_F(EngineStoreTest, ResumedTurnsRestoredByPartialRecomputeMatchRecompute) {
  const int64_t layers = recompute_engine_->model_config().num_layers;
  for (double ratio : {0.5, 1.0}) {
    SCOPED_TRACE("recompute_ratio " + std::to_string(ratio));
    EngineOptions options = options_with(store_options(""), false);
    options.kv_store.restore_mode = store::RestoreMode::kPartial;
    options.kv_store.recompute_ratio = ratio;
    std::unique_ptr<Engine> engine = make_engine(options);
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "");
    const Turn second = run_turn(*engine, *second_prompt_, "");
    EXPECT_EQ(second.usage.cached_prompt_tokens, kStoredTokens);
    expect_same_as_recompute(*recomputed_second_, second);
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.partial_restores, 1);
    EXPECT_EQ(stats.restore_history_token_layers, kStoredTokens * layers);
    const int64_t recomputed_blocks = ratio == 1.0 ? 13 : 6;  // round(0.5 * 13) on whole blocks
    EXPECT_NEAR(static_cast<double>(stats.restore_recomputed_token_layers),
                static_cast<double>(recomputed_blocks * 16 * layers), 16.0 * layers);
  }
  EngineOptions options = options_with(store_options(""), false);
  options.kv_store.restore_mode = store::RestoreMode::kKrul;
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  run_first_turn(*engine, "a");
  run_turn(*engine, *second_prompt_, "a");  // loads: the costs are measured now
  run_first_turn(*engine, "b");
  // The other session's first turn is stored too (2 saves, then 3).
  wait_for_saves(*engine, 3);
  const Turn second = run_turn(*engine, *second_prompt_, "b");
  expect_same_as_recompute(*recomputed_second_, second);
}

// CachedAttention's read buffer: a request waiting behind another has the first layers of its
// stored KV pre-loaded during the other's passes, and computes what recomputing computes.
TEST_F(EngineStoreTest, APreloadedTurnMatchesRecompute) {
  EngineOptions options = options_with(store_options(""), false);
  options.scheduler.max_num_seqs = 1;  // the second request waits while the first decodes
  options.kv_store.read_buffer_layers = 7;
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  run_first_turn(*engine, "");
  GenerateRequest busy;
  busy.prompt_token_ids = wikitext(90000, 50);
  busy.sampling.temperature = 0;
  busy.sampling.max_tokens = 24;
  busy.sampling.ignore_eos = true;
  StatusOr<std::shared_ptr<RequestStream>> busy_stream = engine->submit(std::move(busy));
  ASSERT_TRUE(busy_stream.ok()) << busy_stream.status().to_string();
  const Turn second = run_turn(*engine, *second_prompt_, "");
  while ((*busy_stream)->next()) {
  }
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  expect_same_as_recompute(*recomputed_second_, second);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.preloads, 1);
  EXPECT_EQ(stats.preloaded_layers, 7);
}

// A request that arrived while the turn holding its history was still running (so its lookup
// at admission found nothing) looks the store up again at the head of the queue and loads it.
TEST_F(EngineStoreTest, AQueuedRequestLoadsKvSavedWhileItWaited) {
  EngineOptions options = options_with(store_options(""), false);
  options.scheduler.max_num_seqs = 1;
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  GenerateRequest first;
  first.prompt_token_ids = *history_;
  first.sampling.temperature = 0;
  first.sampling.max_tokens = kNewTokens;
  first.sampling.ignore_eos = true;
  StatusOr<std::shared_ptr<RequestStream>> first_stream = engine->submit(std::move(first));
  ASSERT_TRUE(first_stream.ok()) << first_stream.status().to_string();
  const Turn second = run_turn(*engine, *second_prompt_, "");
  std::vector<TokenId> reply;
  while (std::optional<RequestOutput> out = (*first_stream)->next()) {
    for (const TokenOutput& t : out->tokens) reply.push_back(t.token);
  }
  ASSERT_EQ(reply, *first_reply_);
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  expect_same_as_recompute(*recomputed_second_, second);
}

// KV is copied out by the forward passes that compute it (CachedAttention's layer-wise saving)
// while the turn runs, published when the turn ends (each block once), and given back when the
// turn is cancelled.
TEST_F(EngineStoreTest, SavesRunWithTheTurnAndPublishAtItsEnd) {
  std::unique_ptr<Engine> engine = make_engine(options_with(store_options(""), false));
  ASSERT_TRUE(engine);
  const int64_t chunk_bytes = engine->executor().kv_chunk_bytes();
  GenerateRequest request;
  request.prompt_token_ids = *history_;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 2000;
  request.sampling.ignore_eos = true;
  StatusOr<std::shared_ptr<RequestStream>> stream = engine->submit(std::move(request));
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  // After 20 tokens, 219 positions are computed: 13 full blocks, saved by the passes so far.
  size_t generated = 0;
  while (generated < 20) {
    std::optional<RequestOutput> out = (*stream)->next();
    ASSERT_TRUE(out && !out->finish_reason);
    generated += out->tokens.size();
  }
  EngineStats during = engine->stats();
  for (int i = 0; i < 200 && during.pool_bytes_saved < 13 * chunk_bytes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    during = engine->stats();
  }
  EXPECT_GE(during.pool_bytes_saved, 13 * chunk_bytes);
  EXPECT_GE(during.store->tier("dram").used_bytes, 13 * chunk_bytes) << "the chunks are reserved";
  EXPECT_EQ(during.store->tier("dram").saves, 0) << "and not published before the turn ends";
  EXPECT_EQ(during.store_saved_tokens, 0);
  engine->cancel((*stream)->id());
  while (std::optional<RequestOutput> out = (*stream)->next()) {
    if (out->finish_reason) {
      EXPECT_EQ(*out->finish_reason, FinishReason::kAbort);
    }
  }
  EngineStats cancelled = engine->stats();
  for (int i = 0; i < 200 && cancelled.store->tier("dram").used_bytes > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    cancelled = engine->stats();
  }
  EXPECT_EQ(cancelled.store->tier("dram").used_bytes, 0);
  EXPECT_EQ(cancelled.store->items, 0);

  run_first_turn(*engine, "");
  const EngineStats done = engine->stats();
  EXPECT_EQ(done.store_saved_tokens, kStoredTokens);
  EXPECT_EQ(done.store->tier("dram").saves, 1);
  EXPECT_EQ(done.pool_bytes_saved - cancelled.pool_bytes_saved, kStoredTokens / 16 * chunk_bytes)
      << "each block saved once";
  EXPECT_GT(done.pool_save_seconds, 0);
}

// The CUDA paths: saves gathered layer by layer into a device write buffer and copied to pinned
// DRAM on a side stream; the second turn waits behind another request, so its first 7 layers
// are pre-loaded into the read buffer during that request's passes and the other 23 copied up
// front with one event per layer when it runs. Float32, against recomputing on CUDA.
TEST_F(EngineStoreTest, OnCudaAResumedTurnMatchesRecompute) {
  EngineOptions cuda = options_with(std::nullopt, false);
  cuda.executor.device = executor::Device{executor::DeviceKind::kCuda, 0};
  StatusOr<std::unique_ptr<Engine>> recompute = try_make_engine(cuda);
  if (recompute.status().code() == StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "no CUDA device: " << recompute.status().message();
  }
  ASSERT_TRUE(recompute.ok()) << recompute.status().to_string();
  const Turn first = run_turn(**recompute, *history_, "");
  std::vector<TokenId> second_prompt = *history_;
  second_prompt.insert(second_prompt.end(), first.tokens.begin(), first.tokens.end());
  second_prompt.insert(second_prompt.end(), second_prompt_->end() - 37, second_prompt_->end());
  const Turn expected = run_turn(**recompute, second_prompt, "");
  recompute->reset();

  cuda.kv_store = store_options("");
  cuda.scheduler.max_num_seqs = 1;
  cuda.kv_store.read_buffer_layers = 7;
  std::unique_ptr<Engine> engine = make_engine(cuda);
  ASSERT_TRUE(engine);
  ASSERT_EQ(run_turn(*engine, *history_, "").tokens, first.tokens);
  wait_for_saves(*engine, 1);
  GenerateRequest busy;
  busy.prompt_token_ids = wikitext(90000, 50);
  busy.sampling.max_tokens = 24;
  busy.sampling.ignore_eos = true;
  StatusOr<std::shared_ptr<RequestStream>> busy_stream = engine->submit(std::move(busy));
  ASSERT_TRUE(busy_stream.ok()) << busy_stream.status().to_string();
  const Turn second = run_turn(*engine, second_prompt, "");
  while ((*busy_stream)->next()) {
  }
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.cached_tier, "dram");
  EXPECT_EQ(engine->stats().preloads, 1);
  expect_same_as_recompute(expected, second);
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
  EXPECT_EQ(stats.loaded_tokens("ssd"), kStoredTokens);
  EXPECT_EQ(stats.store->tier("ssd").hits, 1);
  EXPECT_EQ(stats.store->corrupt_chunks, 0);
  // The session's KV can be dropped; the next turn then computes its prompt.
  EXPECT_TRUE(engine->end_session("conversation"));
  EXPECT_FALSE(engine->end_session("conversation"));
}

// The store's lossy codecs (AdaptCache's KIVI): a stored turn re-encoded to KIVI in DRAM is
// loaded encoded and decoded into the pool; the resumed turn's log-probabilities move away from
// recomputing's in the order of the codec's bits (8-bit close, 2-bit further), and after a
// restart the SSD serves the encoded chunks as they were.
double mean_logprob_error(const Turn& recompute, const Turn& resumed) {
  double sum = 0;
  size_t n = 0;
  for (; n < recompute.tokens.size() && resumed.tokens[n] == recompute.tokens[n]; ++n) {
    sum += std::abs(resumed.logprobs[n] - recompute.logprobs[n]);
  }
  EXPECT_GE(n, 1u) << "the first token differs";
  return n == 0 ? 1e9 : sum / static_cast<double>(n);
}

Turn resumed_with_codec(const std::string& codec, const std::string& ssd_dir, bool restart,
                        executor::Device device = {}) {
  store::StoreConfig store = store_options(ssd_dir);
  store.adaptcache.fixed_codec = codec;
  EngineOptions options = options_with(store, false);
  options.executor.device = device;
  std::unique_ptr<Engine> engine = make_engine(options);
  EXPECT_TRUE(engine);
  if (!engine) return {};
  EngineStoreTest::run_first_turn(*engine, "conversation");
  for (int i = 0; i < 500 && engine->stats().store->transcodes < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const store::StoreStats stats = *engine->stats().store;
  EXPECT_EQ(stats.transcodes, 1);
  EXPECT_EQ(stats.items, 1);
  EXPECT_EQ(stats.codec_items[0], 0) << "the item is encoded";
  if (restart) {
    engine.reset();  // a clean shutdown writes the encoded item to SSD
    engine = make_engine(options);
  }
  const Turn second = run_turn(*engine, EngineStoreTest::second_prompt(), "conversation");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, EngineStoreTest::kStoredTokens);
  EXPECT_EQ(second.usage.cached_tier, restart ? "ssd" : "dram");
  return second;
}

TEST_F(EngineStoreTest, ResumedTurnsFromKiviChunksLoseQualityInTheOrderOfTheirBits) {
  const double kivi8 = mean_logprob_error(*recomputed_second_, resumed_with_codec("kivi-8", "", false));
  const double kivi2 = mean_logprob_error(*recomputed_second_, resumed_with_codec("kivi-2", "", false));
  EXPECT_LT(kivi8, 0.05);
  EXPECT_GT(kivi2, kivi8);
  test_util::TempDir dir;
  const double after_restart =
      mean_logprob_error(*recomputed_second_, resumed_with_codec("kivi-8", dir.file("kv"), true));
  EXPECT_NEAR(after_restart, kivi8, 1e-6) << "the SSD served other bytes than DRAM did";
}

// On CUDA the chunks are encoded (pack_kv_blocks, started by the store's I/O thread) and decoded
// (unpack_kv_blocks) on the device: the same bounds and order as on the CPU, against the CPU's
// recomputed turn (float32 both).
TEST_F(EngineStoreTest, OnCudaResumedTurnsFromKiviChunksLoseQualityInTheOrderOfTheirBits) {
  EngineOptions cuda = options_with(std::nullopt, false);
  cuda.executor.device = executor::Device{executor::DeviceKind::kCuda, 0};
  StatusOr<std::unique_ptr<Engine>> probe = try_make_engine(cuda);
  if (probe.status().code() == StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "no CUDA device: " << probe.status().message();
  }
  ASSERT_TRUE(probe.ok()) << probe.status().to_string();
  for (const kernels::OpCheck& c : (*probe)->executor().kernel_report().ops) {
    EXPECT_EQ(c.result, kernels::SelfCheckResult::kPassed) << kernels::kernel_op_name(c.op);
  }
  probe->reset();
  const double kivi8 = mean_logprob_error(
      *recomputed_second_, resumed_with_codec("kivi-8", "", false, cuda.executor.device));
  const double kivi2 = mean_logprob_error(
      *recomputed_second_, resumed_with_codec("kivi-2", "", false, cuda.executor.device));
  EXPECT_LT(kivi8, 0.05);
  EXPECT_GT(kivi2, kivi8);
}

// A request names the task family its stored KV is weighed under (kv_task): one the profile
// lists is served, any other refused naming the families; a profile whose codecs do not all give
// the same families is refused at start-up, naming the codec.
TEST_F(EngineStoreTest, RequestsNameATaskFamilyOfTheAdaptCacheProfile) {
  test_util::TempDir dir;
  auto write_profile = [&](const std::string& name, const std::string& kivi2_tasks) {
    std::ofstream(dir.file(name)) << R"({"prefill_seconds_per_token": 0.002,
                "tiers": [{"name": "dram", "bandwidth": 1e10}],
                "codecs": [{"name": "kivi-8", "quality": 0.9,
                            "task_quality": {"chat": 0.95, "long-document": 0.8}},
                           {"name": "kivi-2", "quality": 0.5, "task_quality": )"
                                  << kivi2_tasks << "}]}";
    return dir.file(name);
  };
  store::StoreConfig store = store_options("");
  store.adaptcache.enabled = true;
  store.adaptcache.profile = write_profile("good.json", R"({"chat": 0.7, "long-document": 0.2})");
  std::unique_ptr<Engine> engine = make_engine(options_with(store, false));
  ASSERT_TRUE(engine);
  GenerateRequest request;
  request.prompt_token_ids = *history_;
  request.sampling.max_tokens = 2;
  request.kv_task = "long-document";
  StatusOr<std::shared_ptr<RequestStream>> stream = engine->submit(request);
  ASSERT_TRUE(stream.ok()) << stream.status().to_string();
  while ((*stream)->next()) {
  }
  request.kv_task = "code";
  stream = engine->submit(request);
  ASSERT_FALSE(stream.ok());
  EXPECT_EQ(stream.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(stream.status().message().find("'code' is not a task family of the AdaptCache "
                                           "profile (chat, long-document)"),
            std::string::npos)
      << stream.status().message();
  engine.reset();

  store.adaptcache.profile = write_profile("uneven.json", R"({"chat": 0.7})");
  StatusOr<std::unique_ptr<Engine>> uneven = try_make_engine(options_with(store, false));
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("codec kivi-2 has quality for 1 task families, the "
                                           "first codec for 2"),
            std::string::npos)
      << uneven.status().message();
  // A codec naming another family, or with families not given as an object, is refused too.
  store.adaptcache.profile = write_profile("other.json", R"({"chat": 0.7, "code": 0.2})");
  StatusOr<std::unique_ptr<Engine>> other = try_make_engine(options_with(store, false));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("codec kivi-2 has no quality for task family "
                                          "'long-document'"),
            std::string::npos)
      << other.status().message();
  store.adaptcache.profile = write_profile("list.json", "[0.7, 0.2]");
  StatusOr<std::unique_ptr<Engine>> list = try_make_engine(options_with(store, false));
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("codec kivi-2: task_quality must be an object"),
            std::string::npos)
      << list.status().message();
  // A codec listed twice (which of its qualities would count?) is refused too.
  std::ofstream(dir.file("twice.json"))
      << R"({"prefill_seconds_per_token": 0.002, "tiers": [{"name": "dram", "bandwidth": 1e10}],
             "codecs": [{"name": "kivi-8", "quality": 0.9}, {"name": "kivi-8", "quality": 0.5}]})";
  store.adaptcache.profile = dir.file("twice.json");
  StatusOr<std::unique_ptr<Engine>> twice = try_make_engine(options_with(store, false));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("codec kivi-8 is listed twice"), std::string::npos)
      << twice.status().message();
}

// Cached KV is keyed by the model's content: a copy of the model file elsewhere finds the KV the
// original saved; weights that differ in one byte, or another pool format, find nothing.
TEST_F(EngineStoreTest, AMovedModelFileKeepsItsSsdHits) {
  test_util::TempDir dir;
  {
    std::unique_ptr<Engine> engine = make_engine(options_with(store_options(dir.file("kv")), false));
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "conversation");
  }
  const std::string moved = dir.file("elsewhere.gguf");
  std::filesystem::copy_file(STRATA_TEST_MODEL, moved);
  std::unique_ptr<Engine> engine =
      make_engine(options_with(store_options(dir.file("kv")), false), moved);
  ASSERT_TRUE(engine);
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.cached_tier, "ssd");
  expect_same_as_recompute(*recomputed_second_, second);
}

TEST_F(EngineStoreTest, OtherWeightsOrAnotherPoolFormatNeverHit) {
  test_util::TempDir dir;
  auto first_turn = [&] {
    std::unique_ptr<Engine> engine = make_engine(options_with(store_options(dir.file("kv")), false));
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "conversation");
  };
  auto expect_no_hit = [&](EngineOptions options, const std::string& model) {
    std::unique_ptr<Engine> engine = make_engine(options, model);
    ASSERT_TRUE(engine);
    const Turn second = run_turn(*engine, *second_prompt_, "conversation");
    EXPECT_EQ(second.usage.loaded_prompt_tokens, 0) << model;
    EXPECT_EQ(second.usage.cached_prompt_tokens, 0) << model;
  };
  // The same model file with one byte of its last tensor's data changed.
  const std::string altered = dir.file("altered.gguf");
  std::filesystem::copy_file(STRATA_TEST_MODEL, altered);
  {
    std::fstream f(altered, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-64, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x01);
    f.seekp(-64, std::ios::end);
    f.write(&byte, 1);
  }
  first_turn();
  expect_no_hit(options_with(store_options(dir.file("kv")), false), altered);
  first_turn();
  EngineOptions bf16 = options_with(store_options(dir.file("kv")), false);
  bf16.executor.dtype = DType::kBFloat16;  // bf16 pool pages
  expect_no_hit(bf16, STRATA_TEST_MODEL);
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

// Context overflow on tiny_qwen2 (random weights, 512-token window, 16-token blocks): the engine
// drops the oldest history after the first block so the rest fills half the window. With one
// layer, a token's keys (before RoPE) and values do not depend on the tokens before it, so stored
// KV re-rotated after a truncation must give what computing the truncated prompt gives: that
// checks which stored chunk lands in which block.
class EngineTruncationTest : public ::testing::Test {
 protected:
  static std::string tiny_qwen2(int layers) {
    return std::string(STRATA_TEST_DATA_DIR) +
           (layers == 1 ? "/model/tiny_qwen2_1layer.gguf" : "/model/tiny_qwen2.gguf");
  }
  static std::unique_ptr<Engine> engine(double fraction, std::optional<store::StoreConfig> store,
                                        int layers = 2) {
    EngineOptions options;
    options.scheduler.overflow_truncation_fraction = fraction;
    options.kv_store = store.value_or(store::StoreConfig{});
    return make_engine(options, tiny_qwen2(layers));
  }
  static std::vector<TokenId> random_tokens(size_t n, uint32_t seed) {
    std::vector<TokenId> t(n);
    uint32_t x = seed;
    for (TokenId& v : t) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<TokenId>((x >> 8) % 300);
    }
    return t;
  }
  // The next turn's prompt: `prompt`, the first 8 tokens of its answer, then 40 new tokens.
  static std::vector<TokenId> next_prompt(std::vector<TokenId> prompt, const Turn& answer,
                                          uint32_t seed) {
    prompt.insert(prompt.end(), answer.tokens.begin(), answer.tokens.begin() + 8);
    const std::vector<TokenId> next = random_tokens(40, seed);
    prompt.insert(prompt.end(), next.begin(), next.end());
    return prompt;
  }
  // The prompt the engine runs: the first block, then what follows the dropped tokens.
  static std::vector<TokenId> truncated(const std::vector<TokenId>& prompt, int64_t drop) {
    std::vector<TokenId> kept(prompt.begin(), prompt.begin() + 16);
    kept.insert(kept.end(), prompt.begin() + 16 + drop, prompt.end());
    return kept;
  }
};

TEST_F(EngineTruncationTest, AnOverflowingPromptRunsWithItsOldestHistoryDropped) {
  std::unique_ptr<Engine> truncating = engine(0.5, std::nullopt);
  std::unique_ptr<Engine> plain = engine(0, std::nullopt);
  ASSERT_TRUE(truncating && plain);
  const std::vector<TokenId> prompt = random_tokens(600, 1);
  // keep <= 256 tokens: drop ceil((600 - 256) / 16) * 16 = 352 after the first block.
  const Turn turn = run_turn(*truncating, prompt, "");
  EXPECT_EQ(turn.usage.prompt_tokens, 600);
  EXPECT_EQ(turn.usage.truncated_prompt_tokens, 352);
  std::vector<TokenId> kept(prompt.begin(), prompt.begin() + 16);
  kept.insert(kept.end(), prompt.begin() + 16 + 352, prompt.end());
  const Turn expected = run_turn(*plain, kept, "");
  EXPECT_EQ(turn.tokens, expected.tokens);
  EXPECT_EQ(kept, truncated(prompt, 352));
  // Without truncation the same prompt is refused.
  GenerateRequest request;
  request.prompt_token_ids = prompt;
  EXPECT_EQ(plain->submit(request).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EngineTruncationTest, ASessionKeepsLoadingItsTruncatedHistory) {
  store::StoreConfig store;
  store.dram_bytes = 16 << 20;
  std::unique_ptr<Engine> e = engine(0.5, store, /*layers=*/1);
  std::unique_ptr<Engine> plain = engine(0, std::nullopt, /*layers=*/1);
  ASSERT_TRUE(e && plain);
  // Turn 1: 480 tokens fit; the store keeps 480 + 16 - 1 computed tokens: 30 blocks.
  const std::vector<TokenId> first = random_tokens(480, 2);
  const Turn one = run_turn(*e, first, "s");
  EXPECT_EQ(one.usage.truncated_prompt_tokens, 0);
  wait_for_saves(*e, 1);
  // Turn 2: 528 tokens overflow: 272 dropped after block 0. The sequence is block 0 and the
  // stored blocks 18..29 (13 blocks loaded, re-rotated), then 48 computed tokens.
  const std::vector<TokenId> second = next_prompt(first, one, 3);
  const Turn two = run_turn(*e, second, "s");
  EXPECT_EQ(two.usage.prompt_tokens, 528);
  EXPECT_EQ(two.usage.truncated_prompt_tokens, 272);
  EXPECT_EQ(two.usage.loaded_prompt_tokens, 13 * 16);
  EXPECT_EQ(two.usage.cached_tier, "dram");
  expect_same_as_recompute(run_turn(*plain, truncated(second, 272), ""), two);
  // The truncated turn replaced the session's item (256 + 16 - 1 computed tokens: 16 blocks; on
  // the CPU a save is published before the request's last delta).
  // Turn 3: 576 tokens; the session's KV dropped 272, the window now needs 320: block 0 and
  // the stored blocks 4..15 load.
  const std::vector<TokenId> third = next_prompt(second, two, 4);
  const Turn three = run_turn(*e, third, "s");
  EXPECT_EQ(three.usage.truncated_prompt_tokens, 320);
  EXPECT_EQ(three.usage.loaded_prompt_tokens, 13 * 16);
  expect_same_as_recompute(run_turn(*plain, truncated(third, 320), ""), three);
  EXPECT_EQ(e->stats().store_load_failures, 0);
  // Truncated KV is found by session only. A stateless client resending the history finds the
  // first turn's exact item by content (it stayed when the session moved on): block 0 and its
  // blocks 21..29 survive the 320 dropped tokens.
  const Turn stateless = run_turn(*e, third, "");
  EXPECT_EQ(stateless.usage.truncated_prompt_tokens, 320);
  EXPECT_EQ(stateless.usage.loaded_prompt_tokens, 10 * 16);
  expect_same_as_recompute(run_turn(*plain, truncated(third, 320), ""), stateless);
}

// StreamingLLM token dropping (AdaptCache's second method), with no context overflow: the store
// keeps the first chunk (the attention sinks) and the most recent half of a conversation's
// chunks, and a stateless client resending the whole history runs on it with the dropped tokens
// left out, which with one layer is exactly computing the shortened prompt. The resumed turn's
// save continues the conversation's chain links, so the next turn finds it by content too.
TEST_F(EngineTruncationTest, ATokenDroppedConversationRunsOnItsShortenedHistoryTurnAfterTurn) {
  store::StoreConfig store;
  store.dram_bytes = 16 << 20;
  store.adaptcache.fixed_codec = "streaming-0.5";
  std::unique_ptr<Engine> e = engine(0, store, /*layers=*/1);
  std::unique_ptr<Engine> plain = engine(0, std::nullopt, /*layers=*/1);
  ASSERT_TRUE(e && plain);
  auto wait_for_transcodes = [&](int64_t n) {
    for (int i = 0; i < 500 && e->stats().store->transcodes < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(e->stats().store->transcodes, n);
  };
  // Turn 1 keeps 200 + 16 - 1 computed tokens: 13 blocks; the codec keeps block 0 and 7..12.
  const std::vector<TokenId> first = random_tokens(200, 5);
  const Turn one = run_turn(*e, first, "");
  wait_for_saves(*e, 1);
  wait_for_transcodes(1);
  // Turn 2: 248 tokens; the 96 tokens of blocks 1..6 are left out, 7 blocks load.
  const std::vector<TokenId> second = next_prompt(first, one, 6);
  const Turn two = run_turn(*e, second, "");
  EXPECT_EQ(two.usage.prompt_tokens, 248);
  EXPECT_EQ(two.usage.truncated_prompt_tokens, 96);
  EXPECT_EQ(two.usage.loaded_prompt_tokens, 7 * 16);
  expect_same_as_recompute(run_turn(*plain, truncated(second, 96), ""), two);
  // Turn 2 computed 152 + 15 tokens: 10 blocks, links 0 and 7..15 of the conversation's 16;
  // re-encoded, 8 are kept (links 0 and 9..15), 128 tokens left out in all.
  wait_for_saves(*e, 2);
  wait_for_transcodes(2);
  const std::vector<TokenId> third = next_prompt(second, two, 7);
  const Turn three = run_turn(*e, third, "");
  EXPECT_EQ(three.usage.truncated_prompt_tokens, 128);
  EXPECT_EQ(three.usage.loaded_prompt_tokens, 8 * 16);
  expect_same_as_recompute(run_turn(*plain, truncated(third, 128), ""), three);
  EXPECT_EQ(e->stats().store_load_failures, 0);
}

}  // namespace
}  // namespace strata::engine
