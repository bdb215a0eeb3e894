// The engine with its KV store (CachedAttention) on the real default model, float32 on the CPU
// (label: model).
//
// A conversation's second turn finds its history in the device pool's prefix cache, in the
// store's DRAM tier, or on SSD after the engine restarted, and must produce what computing the
// whole prompt produces: the same greedy tokens, each with a log-probability within
// kLogprobTolerance. A token may differ only where the recomputing run's top two log-probabilities
// are closer than kTieTolerance (the test checks that this is the reason and compares no
// further). A corrupt SSD chunk must be detected and counted, and the turn recomputed correctly.

#include "engine_store_fixture.h"

namespace strata::engine {
namespace {

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

// A turn whose KV is larger than DRAM is stored whole: DRAM holds 8 of its 13 chunks, so the
// save publishes what it has written after each pass, the store moves those to SSD and takes the
// rest as DRAM frees up, and the next turn loads the whole history (a save used to stop at the
// room DRAM had when it started).
TEST_F(EngineStoreTest, ATurnLargerThanDramIsStoredWholeThroughTheSsd) {
  test_util::TempDir dir;
  store::StoreConfig store = store_options(dir.file("kv"));
  store.dram_bytes = 8 * kChunkBytes;
  std::unique_ptr<Engine> engine = make_engine(options_with(store, false));
  ASSERT_TRUE(engine);
  const Turn first = run_turn(*engine, *history_, "");
  ASSERT_EQ(first.tokens, *first_reply_);
  wait_for(
      *engine,
      [&](const EngineStats& s) {
        return s.store && s.store->tier("dram").bytes_in >= kStoredTokens / 16 * kChunkBytes;
      },
      "every chunk of the turn published");
  const EngineStats saved = engine->stats();
  EXPECT_EQ(saved.store_saved_tokens, kStoredTokens);
  EXPECT_GE(saved.store->saves_partial, 1) << "DRAM was short for the turn";
  EXPECT_GE(saved.store->tier("dram").saves, 2) << "published in pieces";
  EXPECT_EQ(saved.store->items, 1);

  const Turn second = run_turn(*engine, *second_prompt_, "");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  expect_same_as_recompute(*recomputed_second_, second);
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.loaded_tokens("ssd"), 0);
  EXPECT_EQ(stats.store->corrupt_chunks, 0);
  EXPECT_EQ(stats.store_load_failures, 0);
}

// Three conversations saving at once into a DRAM that holds one of them (each publishes in
// pieces while the others do), then their next turns at once: each loads its whole history and
// answers as recomputing its prompt does. 64 new tokens give the store's I/O threads time to
// demote the pieces before the turns end; a block the store has no room for by then is not
// stored (under load the last reply block may miss), so at least each prompt's 12 blocks are.
TEST_F(EngineStoreTest, ConcurrentTurnsLargerThanDramResumeAsRecomputed) {
  test_util::TempDir dir;
  store::StoreConfig store = store_options(dir.file("kv"));
  store.dram_bytes = 16 * kChunkBytes;
  std::unique_ptr<Engine> engine = make_engine(options_with(store, false));
  ASSERT_TRUE(engine);
  constexpr int kReply = 64;
  constexpr int64_t kStored = (200 + kReply - 1) / 16 * 16;  // 16 blocks each
  constexpr int64_t kPromptBlocks = 200 / 16;
  std::vector<std::vector<TokenId>> prompts;
  for (size_t skip : {20000, 30000, 40000}) prompts.push_back(wikitext(skip, 200));
  auto run_all = [&](Engine& e) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const std::vector<TokenId>& p : prompts) streams.push_back(start_turn(e, p, "", kReply));
    std::vector<Turn> turns;
    for (const auto& s : streams) turns.push_back(read_turn(s.get()));
    return turns;
  };
  const std::vector<Turn> first = run_all(*engine);
  wait_for(
      *engine,
      [&](const EngineStats& s) {
        return s.store && s.store->tier("dram").bytes_in >= 3 * kPromptBlocks * kChunkBytes;
      },
      "every chunk of the three turns published");
  for (size_t i = 0; i < prompts.size(); ++i) {
    expect_same_as_recompute(run_turn(*recompute_engine_, prompts[i], "", kReply), first[i]);
    prompts[i].insert(prompts[i].end(), first[i].tokens.begin(), first[i].tokens.end());
    const std::vector<TokenId> next = wikitext(60000 + 1000 * i, 37);
    prompts[i].insert(prompts[i].end(), next.begin(), next.end());
  }
  const std::vector<Turn> second = run_all(*engine);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("conversation " + std::to_string(i));
    EXPECT_GE(second[i].usage.loaded_prompt_tokens, kPromptBlocks * 16);
    EXPECT_LE(second[i].usage.loaded_prompt_tokens, kStored);
    expect_same_as_recompute(run_turn(*recompute_engine_, prompts[i], "", kReply), second[i]);
  }
  EXPECT_GE(engine->stats().store->saves_partial + engine->stats().store->saves_skipped, 1)
      << "DRAM was short for the three turns";
  EXPECT_EQ(engine->stats().store_load_failures, 0);
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

// FreeKV with the store: a sequence saves the blocks the pool computes (its prompt's 12 full
// blocks) and none once it decodes off the pool (its reply completes block 13, which the pool
// never holds); after a restart the next turn loads them from the SSD and leaves the pool in
// turn. FreeKV's budget covers the whole context, so its decode equals full attention and the
// turns are the recomputing engine's.
TEST_F(EngineStoreTest, FreeKvSavesWhatThePoolComputedAndLoadsIt) {
  test_util::TempDir dir;
  EngineOptions options = options_with(store_options(dir.file("kv")), false);
  options.executor.freekv = {.enabled = true, .page_tokens = 16, .budget_tokens = 512,
                             .sink_tokens = 32, .window_tokens = 32, .min_context_tokens = 64};
  constexpr int64_t kPromptBlocks = 200 / 16;
  {
    std::unique_ptr<Engine> engine = make_engine(options);
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "conversation");
    const EngineStats stats = engine->stats();
    EXPECT_GT(stats.freekv.head_steps, 0) << "the first turn did not decode off the pool";
    EXPECT_EQ(stats.store_saved_tokens, kPromptBlocks * 16);
  }  // a clean shutdown writes DRAM-only items to SSD
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kPromptBlocks * 16);
  EXPECT_EQ(second.usage.cached_tier, "ssd");
  expect_same_as_recompute(*recomputed_second_, second);
  wait_for(*engine, [](const EngineStats& s) { return s.freekv.sequences == 0; },
           "FreeKV to end the sequence");
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.freekv.head_steps, 0) << "the resumed turn did not decode off the pool";
  EXPECT_EQ(stats.store->corrupt_chunks, 0);
}

// A resumed turn restored from the SSD with its reads beside the pass (partial at 0.5): the
// recomputing engine's answer, the SSD reported as the tier it loaded from, and its save extends
// the conversation's item (only the new turn's blocks 13-15 are written): the history's chunks
// are pinned, read by layer ranges into the lease's buffers, and never make the item busy.
TEST_F(EngineStoreTest, ARestorationReadBesideThePassExtendsItsConversation) {
  test_util::TempDir dir;
  EngineOptions options = options_with(store_options(dir.file("kv")), false);
  options.kv_store.restore_mode = store::RestoreMode::kPartial;
  options.kv_store.recompute_ratio = 0.5;
  // Paced, so that the reads run during the pass.
  options.kv_store.ssd_bandwidth_limit = int64_t{20} << 20;
  {
    std::unique_ptr<Engine> engine = make_engine(options);
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "conversation");
  }  // a clean shutdown writes DRAM-only items to SSD
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  expect_same_as_recompute(*recomputed_second_, second);
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.cached_tier, "ssd");
  wait_for_saves(*engine, 1);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.partial_restores, 1);
  EXPECT_EQ(stats.loaded_tokens("ssd"), kStoredTokens);
  EXPECT_EQ(stats.store_saved_tokens, 3 * 16);
  // The restoring pass is timed, and its layers' waits for the reads are a part of it.
  EXPECT_GT(stats.restore_pass_seconds, 0);
  EXPECT_GE(stats.restore_wait_seconds, 0);
  EXPECT_LT(stats.restore_wait_seconds, stats.restore_pass_seconds);
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

// Loaded before the pass (restore_mode load), or read beside it by a restoration that recomputes
// the first blocks (partial at 0.5: the corrupt chunk 8 is among the others, read while the pass
// runs, and the pass's results are dropped).
TEST_F(EngineStoreTest, ACorruptSsdChunkIsCountedAndTheTurnRecomputed) {
  for (const store::RestoreMode mode : {store::RestoreMode::kLoad, store::RestoreMode::kPartial}) {
    SCOPED_TRACE(mode == store::RestoreMode::kLoad ? "loaded" : "restored, read beside the pass");
    test_util::TempDir dir;
    EngineOptions options = options_with(store_options(dir.file("kv")), false);
    options.kv_store.restore_mode = mode;
    options.kv_store.recompute_ratio = 0.5;
    {
      std::unique_ptr<Engine> engine = make_engine(options);
      ASSERT_TRUE(engine);
      run_first_turn(*engine, "conversation");
    }
    // Flip one byte of chunk 8 (the data file's first 13 x 737,280 bytes hold the 13 chunks).
    const std::string data = dir.file("kv") + "/data-000.bin";
    ASSERT_TRUE(std::filesystem::exists(data));
    {
      std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(8 * kChunkBytes + 4321);
      char byte = 0;
      f.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x5a);
      f.seekp(8 * kChunkBytes + 4321);
      f.write(&byte, 1);
    }
    std::unique_ptr<Engine> engine = make_engine(options);
    ASSERT_TRUE(engine);
    const Turn second = run_turn(*engine, *second_prompt_, "conversation");
    EXPECT_EQ(second.usage.loaded_prompt_tokens, 0);
    EXPECT_EQ(second.usage.cached_prompt_tokens, 0);
    expect_same_as_recompute(*recomputed_second_, second);
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.store_load_failures, 1);
    EXPECT_GE(stats.store->corrupt_chunks, 1);
    // A failed restoration restored nothing. Read beside the pass, its chunks were pinned (one
    // SSD hit) before the read of chunk 8's first layer failed during the pass; loaded before
    // it, the one read of all 13 failed.
    EXPECT_EQ(stats.partial_restores, 0);
    EXPECT_EQ(stats.store->tier("ssd").hits, mode == store::RestoreMode::kPartial ? 1 : 0);
  }
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
