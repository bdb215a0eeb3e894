// The store's lossy codecs and stored forms with the engine on the real default model, float32 on
// the CPU (label: model): KIVI (AdaptCache), the task families of AdaptCache's profile, Krul's
// layer merge of a conversation's layer pairs, H2O's heavy hitters (Krul's H2O baseline), and
// Krul's stored suffix, alone and of merged layer pairs.
#include "engine_store_fixture.h"

namespace strata::engine {
namespace {

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
                        executor::Device device = {},
                        const std::function<void(store::StoreConfig&)>& configure = nullptr) {
  store::StoreConfig store = store_options(ssd_dir);
  store.adaptcache.fixed_codec = codec;
  if (configure) configure(store);
  EngineOptions options = options_with(store, false);
  options.executor.device = device;
  std::unique_ptr<Engine> engine = make_engine(options);
  EXPECT_TRUE(engine);
  if (!engine) return {};
  EngineStoreTest::run_first_turn(*engine, "conversation");
  wait_for(
      *engine, [](const EngineStats& s) { return s.store->transcodes >= 1; }, "a re-encoding");
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

// Krul's layer merge (kv_store.layer_pairing with fixed_codec layer-merge): at the first turn's
// end the conversation's layer pairs are chosen (minicache: the deepest adjacent layers; krul:
// I-R layers paired by the distance of the attention the turn observed), the stored item is
// merged, and the resumed turn loads it restored from its pairs. The log-probabilities drift
// from recomputing's more as more layers are paired, and after a restart the SSD serves the
// merged chunks with their pairs (the journal keeps them): the same answer as from DRAM. A
// conversation whose turn found too few I-R layers for the share is stored unmerged.
TEST_F(EngineStoreTest, ResumedTurnsFromMergedLayerPairsDriftWithTheLayersPaired) {
  const auto pairing = [](store::LayerPairing p, double share) {
    return [=](store::StoreConfig& s) {
      s.layer_pairing = p;
      s.layer_share = share;
    };
  };
  // 1 pair (layers 28, 29) and 3 pairs (layers 24 to 29). (8, layers 14 to 29, change the first
  // token: SmolLM2's adjacent layers are nearly orthogonal, docs/krul.md.)
  const double one = mean_logprob_error(
      *recomputed_second_, resumed_with_codec("layer-merge", "", false, {},
                                              pairing(store::LayerPairing::kMiniCache, 0.05)));
  const double three = mean_logprob_error(
      *recomputed_second_, resumed_with_codec("layer-merge", "", false, {},
                                              pairing(store::LayerPairing::kMiniCache, 0.15)));
  std::printf("mean |logprob - recompute|: 1 pair %.4f, 3 pairs %.4f\n", one, three);
  EXPECT_GT(one, 1e-3) << "merging changed nothing";
  EXPECT_GT(three, one);
  // Krul's pairs from the observed attention: 8 pairs of I-R layers, merged and restored.
  store::StoreConfig store = store_options("");
  store.adaptcache.fixed_codec = "layer-merge";
  pairing(store::LayerPairing::kKrul, 0.5)(store);
  std::unique_ptr<Engine> engine = make_engine(options_with(store, false));
  ASSERT_TRUE(engine);
  run_first_turn(*engine, "conversation");
  wait_for(
      *engine, [](const EngineStats& s) { return s.store->transcodes >= 1; }, "a re-encoding");
  const Turn krul = run_turn(*engine, *second_prompt_, "conversation");
  // The stream ends before the step loop finishes the request.
  wait_for(
      *engine, [](const EngineStats& s) { return s.pair_maps >= 2; }, "the second pair map");
  const EngineStats stats = engine->stats();
  // Both turns ended with pairs chosen; the first turn's 8 pairs are stored merged (the second's
  // rows, 53 prompt tokens and 16 steps, may find fewer I-R layers: that item stays raw).
  EXPECT_EQ(stats.pair_maps, 2);
  EXPECT_GE(stats.paired_layers, 16);
  EXPECT_EQ(stats.merged_chunks_loaded, kStoredTokens / 16);
  EXPECT_EQ(krul.usage.loaded_prompt_tokens, kStoredTokens);
  const double krul_error = mean_logprob_error(*recomputed_second_, krul);
  std::printf("krul, 8 pairs: %.4f\n", krul_error);
  EXPECT_GT(krul_error, 1e-4);
  test_util::TempDir dir;
  const double after_restart = mean_logprob_error(
      *recomputed_second_, resumed_with_codec("layer-merge", dir.file("kv"), true, {},
                                              pairing(store::LayerPairing::kMiniCache, 0.15)));
  EXPECT_NEAR(after_restart, three, 1e-6) << "the SSD served other bytes or pairs than DRAM did";
}

// H2O (fixed_codec h2o-0.5): the attention the first turn observed chooses, per layer and KV
// head, the half of its stored tokens the item keeps (the recent half of those and the heaviest
// hitters of the rest): 7 of its 13 chunks, the first and those at links 7-12 of its chain. A
// prompt that reaches links 0-9 only (its first 170 tokens) loads nothing (4 of the 7 chunks hold
// tokens chosen over all 13 blocks); the resumed turn loads the 7 as its history, the dropped
// tokens neither loaded nor recomputed, and answers with log-probabilities that drift from
// recomputing's.
TEST_F(EngineStoreTest, ResumedTurnsFromH2oHeavyHittersLoadTheKeptHalf) {
  store::StoreConfig store = store_options("");
  store.adaptcache.fixed_codec = "h2o-0.5";
  std::unique_ptr<Engine> engine = make_engine(options_with(store, false));
  ASSERT_TRUE(engine);
  run_first_turn(*engine, "conversation");
  wait_for(
      *engine, [](const EngineStats& s) { return s.store->transcodes >= 1; }, "H2O's selection");
  const std::vector<TokenId> part(second_prompt_->begin(), second_prompt_->begin() + 170);
  EXPECT_EQ(run_turn(*engine, part, "").usage.loaded_prompt_tokens, 0);
  const Turn h2o = run_turn(*engine, *second_prompt_, "conversation");
  EXPECT_EQ(h2o.usage.loaded_prompt_tokens, 7 * 16);
  const double h2o_error = mean_logprob_error(*recomputed_second_, h2o);
  const double streaming_error = mean_logprob_error(*recomputed_second_, [] {
    store::StoreConfig s = store_options("");
    s.adaptcache.fixed_codec = "streaming-0.5";
    std::unique_ptr<Engine> e = make_engine(options_with(s, false));
    run_first_turn(*e, "conversation");
    wait_for(
        *e, [](const EngineStats& st) { return st.store->transcodes >= 1; }, "token dropping");
    // Token dropping keeps a prefix of the chain's links: the same partial prompt loads 4.
    const std::vector<TokenId> part(second_prompt_->begin(), second_prompt_->begin() + 170);
    EXPECT_EQ(run_turn(*e, part, "").usage.loaded_prompt_tokens, 4 * 16);
    return run_turn(*e, *second_prompt_, "conversation");
  }());
  std::printf("mean |logprob - recompute|: h2o-0.5 %.4f, streaming-0.5 %.4f\n", h2o_error,
              streaming_error);
  EXPECT_GT(h2o_error, 1e-4) << "keeping half the tokens changed nothing";
}

// Krul's plans cost what this machine measured, and nothing is measured before a restoration
// from the SSD: an engine with `first` stores a "warm" conversation (written whole to the SSD at
// its shutdown); the engine returned, with `options` over the same SSD, has restored it from
// there and ended its session.
std::unique_ptr<Engine> engine_with_measured_costs(const EngineOptions& first,
                                                   const EngineOptions& options) {
  const std::vector<TokenId> warm = EngineStoreTest::wikitext(30000, 40);
  std::vector<TokenId> warm_again = warm;
  {
    std::unique_ptr<Engine> engine = make_engine(first);
    EXPECT_TRUE(engine);
    if (!engine) return nullptr;
    const Turn turn = run_turn(*engine, warm, "warm");
    warm_again.insert(warm_again.end(), turn.tokens.begin(), turn.tokens.end());
    warm_again.push_back(warm.front());
    wait_for_saves(*engine, 1);
    EXPECT_EQ(engine->stats().suffix_turns, 0) << "nothing was measured yet";
  }
  std::unique_ptr<Engine> engine = make_engine(options);
  EXPECT_TRUE(engine);
  if (!engine) return nullptr;
  EXPECT_EQ(run_turn(*engine, warm_again, "warm").usage.cached_tier, "ssd");
  wait_for_saves(*engine, 1);
  EXPECT_TRUE(engine->end_session("warm"));
  return engine;
}

// Krul's stored suffix: a conversation's chunks keep on the SSD only the layers its turn-end plan
// loads. With the SSD paced to 1 MB/s reading costs far more than recomputing, so the plan
// recomputes most of the history in every layer (a chunk keeps at least its last layer). The
// next turn, after a restart, recomputes at least what the chunks left out, reads only the
// layers they kept, and gives the recomputing engine's answer. A turn whose first blocks are in
// the pool's prefix cache cannot restore from position 0: it recomputes its prompt.
TEST_F(EngineStoreTest, AStoredSuffixIsRestoredByRecomputingTheLayersItLeftOut) {
  test_util::TempDir dir;
  EngineOptions options = options_with(store_options(dir.file("kv")), false);
  options.kv_store.restore_mode = store::RestoreMode::kKrul;
  options.kv_store.stored_suffix = true;
  options.kv_store.ssd_bandwidth_limit = int64_t{1} << 20;
  constexpr int64_t kLayers = 30, kLayerBytes = kChunkBytes / kLayers, kChunks = kStoredTokens / 16;
  int64_t dropped = 0;  // chunk-layers the conversation's chunks leave out
  {
    std::unique_ptr<Engine> engine = engine_with_measured_costs(options, options);
    ASSERT_TRUE(engine);
    const EngineStats before = engine->stats();
    run_first_turn(*engine, "conversation");
    wait_for(
        *engine, [&](const EngineStats& s) { return s.suffix_turns > before.suffix_turns; },
        "the conversation's suffix");
    dropped = engine->stats().suffix_dropped_chunk_layers - before.suffix_dropped_chunk_layers;
    EXPECT_GT(dropped, kChunks * kLayers / 2) << "reads are slow: most is recomputed";
    EXPECT_LE(dropped, kChunks * (kLayers - 1));
  }  // the shutdown writes each chunk's kept layers only
  const int64_t kept_bytes = (kChunks * kLayers - dropped) * kLayerBytes;
  options.executor.enable_prefix_caching = true;
  {
    std::unique_ptr<Engine> engine = make_engine(options);
    ASSERT_TRUE(engine);
    const store::TierStats ssd = engine->stats().store->tier("ssd");
    EXPECT_EQ(ssd.raw_bytes, kChunks * kChunkBytes);
    EXPECT_EQ(ssd.used_bytes, kept_bytes);
    const Turn second = run_turn(*engine, *second_prompt_, "conversation");
    expect_same_as_recompute(*recomputed_second_, second);
    EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
    EXPECT_EQ(second.usage.cached_tier, "ssd");
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.partial_restores, 1);
    // Nothing measured yet: the plan is the floor, which reads exactly the kept layers.
    EXPECT_GE(stats.restore_recomputed_token_layers, dropped * 16);
    EXPECT_EQ(stats.store->tier("ssd").bytes_out, kept_bytes);
    EXPECT_EQ(stats.store->corrupt_chunks, 0);
  }
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  // Three blocks of the history restored (by content) leave them in the prefix cache.
  const std::vector<TokenId> start(history_->begin(), history_->begin() + 60);
  EXPECT_EQ(run_turn(*engine, start, "").usage.loaded_prompt_tokens, 3 * 16);
  const Turn again = run_turn(*engine, *second_prompt_, "conversation");
  expect_same_as_recompute(*recomputed_second_, again);
  EXPECT_EQ(again.usage.loaded_prompt_tokens, 0);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.suffix_recomputes, 1);
  EXPECT_EQ(stats.store_load_failures, 0);
}

// A turn longer than DRAM holds publishes its save in pieces, and the first pieces go down to
// the SSD while the turn still runs (13 chunks through 6 of DRAM). Each piece keeps the layers a
// plan of the history so far loads (a chunk's layers are fixed at its first write there), so
// the SSD holds less than half of the conversation's full KV, not its first pieces whole; the
// next turn, after a restart, recomputes what they left out and answers as recomputing does.
TEST_F(EngineStoreTest, PiecesOfATurnLongerThanDramKeepOnlyTheirSuffixOnTheSsd) {
  test_util::TempDir dir;
  store::StoreConfig store = store_options(dir.file("kv"));
  store.dram_bytes = 6 * kChunkBytes;
  store.restore_mode = store::RestoreMode::kKrul;
  store.stored_suffix = true;
  store.ssd_bandwidth_limit = int64_t{1} << 20;
  const EngineOptions options = options_with(store, false);
  {
    std::unique_ptr<Engine> engine = engine_with_measured_costs(options, options);
    ASSERT_TRUE(engine);
    run_first_turn(*engine, "conversation");
    EXPECT_GT(engine->stats().store->saves_partial + engine->stats().store->saves_skipped, 0)
        << "the turn's save was short of DRAM";
  }
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  const store::TierStats ssd = engine->stats().store->tier("ssd");
  std::printf("pieces: %lld of %lld bytes on the SSD\n", static_cast<long long>(ssd.used_bytes),
              static_cast<long long>(ssd.raw_bytes));
  EXPECT_GE(ssd.raw_bytes, 6 * kChunkBytes) << "the pieces that went below during the turn";
  EXPECT_LT(ssd.used_bytes, ssd.raw_bytes / 2);
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  expect_same_as_recompute(*recomputed_second_, second);
  EXPECT_EQ(second.usage.loaded_prompt_tokens, ssd.raw_bytes / kChunkBytes * 16);
  EXPECT_EQ(engine->stats().store_load_failures, 0);
}

// The stored suffix of merged layer pairs (decisions 8 and 12 together): MiniCache's 3 deepest
// pairs are merged in DRAM at the turn's end, and each chunk goes to the SSD from its first
// layer's place in the merged form on (a pair's data sits at its deep layer's place), so the
// shallow layers' empty places make a chunk smaller than dropping as many raw layers would leave
// it at most by the pairs. After a restart the next turn loads the chunks merged (read whole:
// exactly what the SSD holds), restores every one through its pairs, recomputes at least what
// they left out, and answers as recomputing does from its first token.
TEST_F(EngineStoreTest, AStoredSuffixOfMergedLayerPairsKeepsWhatItsLayersAreRestoredFrom) {
  test_util::TempDir dir;
  store::StoreConfig store = store_options(dir.file("kv"));
  store.restore_mode = store::RestoreMode::kKrul;
  store.stored_suffix = true;
  store.ssd_bandwidth_limit = int64_t{1} << 20;
  store.adaptcache.fixed_codec = "layer-merge";
  store.layer_pairing = store::LayerPairing::kMiniCache;
  store.layer_share = 0.15;
  const EngineOptions options = options_with(store, false);
  constexpr int64_t kLayers = 30, kLayerBytes = kChunkBytes / kLayers, kChunks = kStoredTokens / 16;
  constexpr int64_t kPairs = 3, kPairBytes = 3864;  // docs/krul.md decision 8: SmolLM2, float32
  constexpr int64_t kMerged = (kLayers - kPairs) * kLayerBytes + kPairs * kPairBytes;
  int64_t dropped = 0;
  {
    // "warm" stored raw: its next turn extends its item, which its session's end then drops.
    store::StoreConfig plain = store;
    plain.adaptcache.fixed_codec = "none";
    plain.layer_pairing = store::LayerPairing::kNone;
    std::unique_ptr<Engine> engine =
        engine_with_measured_costs(options_with(plain, false), options);
    ASSERT_TRUE(engine);
    const EngineStats before = engine->stats();
    run_first_turn(*engine, "conversation");
    wait_for(
        *engine,
        [&](const EngineStats& s) {
          return s.suffix_turns > before.suffix_turns &&
                 s.store->transcodes > before.store->transcodes;
        },
        "the conversation's suffix and merge");
    dropped = engine->stats().suffix_dropped_chunk_layers - before.suffix_dropped_chunk_layers;
    EXPECT_GT(dropped, kChunks * kLayers / 2) << "reads are slow: most is recomputed";
  }  // the shutdown writes each chunk's suffix of its merged form
  std::unique_ptr<Engine> engine = make_engine(options);
  ASSERT_TRUE(engine);
  const store::TierStats ssd = engine->stats().store->tier("ssd");
  EXPECT_EQ(ssd.chunks, kChunks);
  const Turn second = run_turn(*engine, *second_prompt_, "conversation");
  EXPECT_EQ(second.usage.loaded_prompt_tokens, kStoredTokens);
  EXPECT_EQ(second.usage.cached_tier, "ssd");
  const EngineStats stats = engine->stats();
  // The load read each chunk's stored value once (the tier's footprint rounds each up to pages).
  const int64_t read = stats.store->tier("ssd").bytes_out;
  std::printf("merged suffix: %lld of %lld merged bytes read, mean |logprob - recompute| %.4f\n",
              static_cast<long long>(read), static_cast<long long>(kChunks * kMerged),
              mean_logprob_error(*recomputed_second_, second));
  EXPECT_LE(read, kChunks * kMerged - (dropped - kChunks * kPairs) * kLayerBytes);
  EXPECT_GT(read, 0);
  EXPECT_GE(ssd.used_bytes, read);
  EXPECT_LT(ssd.used_bytes, read + kChunks * 4096);
  EXPECT_EQ(stats.partial_restores, 1);
  EXPECT_EQ(stats.merged_chunks_loaded, kChunks);
  EXPECT_GE(stats.restore_recomputed_token_layers, dropped * 16);
  EXPECT_EQ(stats.store->corrupt_chunks, 0);
  EXPECT_EQ(stats.store_load_failures, 0);
}

}  // namespace
}  // namespace strata::engine
