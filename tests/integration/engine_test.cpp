// Engine end-to-end on real model files (label: model).
//
// Batching equivalence: requests run concurrently (continuous batching, chunked prefill, shared
// prefixes, a pool small enough to force preemption) must produce the greedy tokens each produces
// alone. A token may differ only at a step where the solo run's top-2 logprobs (= logits) are
// closer than kTieTolerance; the test checks that this is the reason, and compares no further.

#include "strata/engine/engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::engine {
namespace {

constexpr double kTieTolerance = 1e-3;

std::string tiny_qwen2_path() { return std::string(STRATA_TEST_DATA_DIR) + "/model/tiny_qwen2.gguf"; }

std::unique_ptr<Engine> make_engine(const std::string& path, EngineOptions options) {
  StatusOr<std::unique_ptr<model::ModelSource>> source = model::open_model_source(path);
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

struct Collected {
  std::vector<TokenId> tokens;
  std::vector<double> top2_gaps;  // per token, when num_logprobs >= 2
  std::string text;
  RequestOutput last;
};

Collected collect(RequestStream& stream) {
  Collected c;
  while (std::optional<RequestOutput> out = stream.next()) {
    for (const TokenOutput& t : out->tokens) {
      c.tokens.push_back(t.token);
      if (t.top_logprobs.size() >= 2) {
        c.top2_gaps.push_back(t.top_logprobs[0].logprob - t.top_logprobs[1].logprob);
      }
    }
    c.text += out->text;
    c.last = std::move(*out);
  }
  return c;
}

std::vector<GenerateRequest> mixed_requests(int n, int vocab, int shared_prefix, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> prefix(shared_prefix);
  for (TokenId& t : prefix) t = static_cast<TokenId>(rng() % vocab);
  std::vector<GenerateRequest> requests(n);
  for (GenerateRequest& r : requests) {
    r.prompt_token_ids = prefix;
    const int own = 1 + static_cast<int>(rng() % 150);
    for (int i = 0; i < own; ++i) r.prompt_token_ids.push_back(static_cast<TokenId>(rng() % vocab));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 1 + static_cast<int>(rng() % 40);
    r.sampling.ignore_eos = true;
    r.sampling.num_logprobs = 2;
  }
  return requests;
}

std::vector<Collected> run_solo(Engine& engine, const std::vector<GenerateRequest>& requests) {
  std::vector<Collected> out;
  for (const GenerateRequest& r : requests) {
    StatusOr<std::shared_ptr<RequestStream>> stream = engine.submit(r);
    EXPECT_TRUE(stream.ok());
    out.push_back(collect(**stream));
  }
  return out;
}

std::vector<Collected> run_concurrent(Engine& engine, const std::vector<GenerateRequest>& requests) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const GenerateRequest& r : requests) {
    StatusOr<std::shared_ptr<RequestStream>> stream = engine.submit(r);
    EXPECT_TRUE(stream.ok());
    streams.push_back(*stream);
  }
  std::vector<Collected> out(requests.size());
  std::vector<std::thread> readers;
  for (size_t i = 0; i < streams.size(); ++i) {
    readers.emplace_back([&, i] { out[i] = collect(*streams[i]); });
  }
  for (std::thread& t : readers) t.join();
  return out;
}

void expect_same_as_solo(const std::vector<Collected>& solo, const std::vector<Collected>& batched) {
  ASSERT_EQ(solo.size(), batched.size());
  int num_ties = 0;
  for (size_t i = 0; i < solo.size(); ++i) {
    ASSERT_EQ(batched[i].last.finish_reason, FinishReason::kLength) << "request " << i;
    ASSERT_EQ(batched[i].tokens.size(), solo[i].tokens.size()) << "request " << i;
    for (size_t t = 0; t < solo[i].tokens.size(); ++t) {
      if (batched[i].tokens[t] == solo[i].tokens[t]) continue;
      ASSERT_LT(solo[i].top2_gaps[t], kTieTolerance)
          << "request " << i << " token " << t << ": " << batched[i].tokens[t] << " vs solo "
          << solo[i].tokens[t] << " where the solo top-2 gap is " << solo[i].top2_gaps[t];
      ++num_ties;
      break;
    }
  }
  EXPECT_LE(num_ties, 2) << "near-ties should be rare";
}

// Waits until the step loop has published stats with every KV block available again.
void expect_pool_fully_free(Engine& engine) {
  EngineStats stats;
  for (int i = 0; i < 200; ++i) {
    stats = engine.stats();
    if (stats.kv_blocks_available == stats.kv_blocks_total && stats.num_running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(stats.kv_blocks_available, stats.kv_blocks_total) << "KV blocks leaked";
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
}

EngineOptions small_engine_options() {
  EngineOptions options;
  options.executor.block_size_tokens = 8;
  options.scheduler.max_num_seqs = 64;
  options.scheduler.max_num_batched_tokens = 256;  // long prompts are chunked
  return options;
}

TEST(EngineTest, SixtyFourConcurrentGreedyRequestsMatchSoloRuns) {
  EngineOptions roomy = small_engine_options();
  roomy.executor.cache_bytes = 16 << 20;  // ~8K blocks: all 64 requests fit at once
  std::unique_ptr<Engine> solo_engine = make_engine(tiny_qwen2_path(), small_engine_options());
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), roomy);
  ASSERT_TRUE(solo_engine && engine);
  const int vocab = static_cast<int>(engine->model_config().vocab_size);
  const std::vector<GenerateRequest> requests = mixed_requests(64, vocab, 0, 1);
  const std::vector<Collected> solo = run_solo(*solo_engine, requests);
  expect_same_as_solo(solo, run_concurrent(*engine, requests));
  EXPECT_EQ(engine->stats().num_preemptions, 0);
  expect_pool_fully_free(*engine);
  expect_pool_fully_free(*solo_engine);
}

TEST(EngineTest, PreemptionUnderATinyPoolKeepsTheTokens) {
  EngineOptions options = small_engine_options();
  // tiny_qwen2: 2 layers, 2 KV heads x 16 dims, 512-token context. The smallest pool the
  // executor accepts holds one full context (128 blocks of 8 tokens over 2 layers).
  options.executor.cache_bytes = 130 * (2 * 2 * 8 * 16 * 4);
  std::unique_ptr<Engine> solo_engine = make_engine(tiny_qwen2_path(), small_engine_options());
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), options);
  ASSERT_TRUE(solo_engine && engine);
  const int vocab = static_cast<int>(engine->model_config().vocab_size);
  const std::vector<GenerateRequest> requests = mixed_requests(24, vocab, 0, 2);
  expect_same_as_solo(run_solo(*solo_engine, requests), run_concurrent(*engine, requests));
  EXPECT_GT(engine->stats().num_preemptions, 0) << "the pool was meant to be too small";
  expect_pool_fully_free(*engine);
}

TEST(EngineTest, SwapPreemptionUnderATinyPoolKeepsTheTokens) {
  EngineOptions options = small_engine_options();
  options.executor.cache_bytes = 130 * (2 * 2 * 8 * 16 * 4);
  options.executor.host_cache_bytes = 4 << 20;
  options.scheduler.preemption_mode = scheduler::PreemptionMode::kSwap;
  std::unique_ptr<Engine> solo_engine = make_engine(tiny_qwen2_path(), small_engine_options());
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), options);
  ASSERT_TRUE(solo_engine && engine);
  const int vocab = static_cast<int>(engine->model_config().vocab_size);
  const std::vector<GenerateRequest> requests = mixed_requests(24, vocab, 0, 4);
  expect_same_as_solo(run_solo(*solo_engine, requests), run_concurrent(*engine, requests));
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.num_swap_outs, 0) << "the pool was meant to force swapping";
  EXPECT_EQ(stats.kv_host_blocks_free, stats.kv_host_blocks_total);
  expect_pool_fully_free(*engine);
}

// kv_cache.page_format: every layer on int8 pages (four base blocks to a page), through swapping
// under a tiny pool and shared prefixes; the swapped bytes come back as they left.
TEST(EngineTest, QuantizedPagesSwapAndShareAndKeepTheTokens) {
  EngineOptions solo_options = small_engine_options();
  solo_options.executor.page_format = kv::KvFormat{{DType::kInt8, kv::Grouping::kPerToken, 16},
                                                   {DType::kInt8, kv::Grouping::kPerToken, 16}};
  EngineOptions options = solo_options;
  options.executor.cache_bytes = 132 * (2 * 2 * 8 * 16 * 4);
  options.executor.host_cache_bytes = 4 << 20;
  options.scheduler.preemption_mode = scheduler::PreemptionMode::kSwap;
  std::unique_ptr<Engine> solo_engine = make_engine(tiny_qwen2_path(), solo_options);
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), options);
  ASSERT_TRUE(solo_engine && engine);
  EXPECT_EQ(engine->executor().kv_geometry().page_blocks, 4);
  const int vocab = static_cast<int>(engine->model_config().vocab_size);
  const std::vector<GenerateRequest> requests = mixed_requests(24, vocab, 40, 5);
  expect_same_as_solo(run_solo(*solo_engine, requests), run_concurrent(*engine, requests));
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.num_swap_outs, 0) << "the pool was meant to force swapping";
  EXPECT_GT(stats.prefix_hit_tokens, 0) << "int8 sequences share their int8 prefixes";
  expect_pool_fully_free(*engine);
}

TEST(EngineTest, SharedPrefixesHitTheCacheAndKeepTheTokens) {
  std::unique_ptr<Engine> solo_engine = make_engine(tiny_qwen2_path(), small_engine_options());
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), small_engine_options());
  ASSERT_TRUE(solo_engine && engine);
  const int vocab = static_cast<int>(engine->model_config().vocab_size);
  std::vector<GenerateRequest> requests = mixed_requests(32, vocab, 120, 3);
  // The first request warms the cache; the others arrive while it runs and after.
  const std::vector<Collected> solo = run_solo(*solo_engine, requests);
  std::vector<Collected> batched = run_concurrent(*engine, {requests[0]});
  std::vector<GenerateRequest> rest(requests.begin() + 1, requests.end());
  std::vector<Collected> more = run_concurrent(*engine, rest);
  batched.insert(batched.end(), more.begin(), more.end());
  expect_same_as_solo(solo, batched);
  const EngineStats stats = engine->stats();
  // 120 shared tokens = 15 blocks of 8; every later request reuses them.
  EXPECT_GE(stats.prefix_hit_tokens, 31 * 120);
  int64_t cached_reported = 0;
  for (size_t i = 1; i < batched.size(); ++i) {
    cached_reported += batched[i].last.usage.cached_prompt_tokens;
    EXPECT_EQ(batched[i].last.usage.prompt_tokens,
              static_cast<int64_t>(requests[i].prompt_token_ids.size()));
  }
  EXPECT_GE(cached_reported, 31 * 120) << "usage reports the cached prompt tokens";
  expect_pool_fully_free(*engine);
}

TEST(EngineTest, CancellationEndsTheStreamAndFreesItsBlocks) {
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), small_engine_options());
  ASSERT_TRUE(engine);
  GenerateRequest request;
  request.prompt_token_ids = {1, 2, 3, 4, 5};
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 400;
  request.sampling.ignore_eos = true;
  StatusOr<std::shared_ptr<RequestStream>> stream = engine->submit(request);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->next().has_value());
  engine->cancel((*stream)->id());
  Collected rest = collect(**stream);
  EXPECT_EQ(rest.last.finish_reason, FinishReason::kAbort);
  EXPECT_LT(rest.last.usage.completion_tokens, 400);
  expect_pool_fully_free(*engine);
}

TEST(EngineTest, SameSeedSameSampledOutput) {
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), small_engine_options());
  ASSERT_TRUE(engine);
  GenerateRequest request;
  request.prompt_token_ids = {7, 8, 9};
  request.sampling.temperature = 1.0;
  request.sampling.top_p = 0.9;
  request.sampling.max_tokens = 24;
  request.sampling.ignore_eos = true;
  request.sampling.seed = 42;
  GenerateRequest other_seed = request;
  other_seed.sampling.seed = 43;
  const std::vector<Collected> runs =
      run_concurrent(*engine, {request, other_seed, request});
  EXPECT_EQ(runs[0].tokens, runs[2].tokens);
  EXPECT_NE(runs[0].tokens, runs[1].tokens);
}

// n samples of one prompt: the prompt is admitted and computed once (the forks never look it
// up), the forks share its pages (the last one partly filled, so copy-on-write), greedy forks
// decode what a solo run decodes, seeded ones draw apart, and every block comes back.
TEST(EngineTest, ParallelSamplesForkAfterOnePrefill) {
  std::unique_ptr<Engine> solo_engine = make_engine(tiny_qwen2_path(), small_engine_options());
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), small_engine_options());
  ASSERT_TRUE(solo_engine && engine);
  const int vocab = static_cast<int>(engine->model_config().vocab_size);
  GenerateRequest greedy = mixed_requests(1, vocab, 45, 11)[0];  // 45 + own tokens, blocks of 8
  greedy.sampling.max_tokens = 24;
  const std::vector<Collected> solo = run_solo(*solo_engine, {greedy});
  StatusOr<std::vector<std::shared_ptr<RequestStream>>> streams =
      engine->submit_parallel(greedy, 3);
  ASSERT_TRUE(streams.ok()) << streams.status().to_string();
  ASSERT_EQ(streams->size(), 3u);
  std::vector<Collected> forks;
  for (auto& stream : *streams) forks.push_back(collect(*stream));
  expect_same_as_solo({solo[0], solo[0], solo[0]}, forks);
  const int64_t prompt = static_cast<int64_t>(greedy.prompt_token_ids.size());
  EXPECT_EQ(engine->stats().prefix_lookup_tokens, prompt) << "the prompt was admitted once";
  for (const Collected& fork : forks) EXPECT_EQ(fork.last.usage.prompt_tokens, prompt);

  GenerateRequest sampled = greedy;
  sampled.sampling.temperature = 1.0;
  sampled.sampling.seed = 5;
  streams = engine->submit_parallel(sampled, 3);
  ASSERT_TRUE(streams.ok());
  std::vector<Collected> draws;
  for (auto& stream : *streams) draws.push_back(collect(*stream));
  EXPECT_NE(draws[0].tokens, draws[1].tokens);
  EXPECT_NE(draws[1].tokens, draws[2].tokens);

  // A fork cancelled right after submission ends with an abort; the others run to their end.
  // Long enough (256 tokens) that the cancel always lands before the fork could finish, also
  // when the suite's other tests hold the cores (8 tokens once finished first under load).
  sampled.sampling.max_tokens = 256;
  streams = engine->submit_parallel(sampled, 2);
  ASSERT_TRUE(streams.ok());
  engine->cancel((*streams)[1]->id());
  EXPECT_EQ(collect(*(*streams)[1]).last.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(collect(*(*streams)[0]).last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(engine->submit_parallel(sampled, 0).status().code(), StatusCode::kInvalidArgument);
  expect_pool_fully_free(*engine);
}

TEST(EngineTest, InvalidRequestsAreRejectedNamingTheField) {
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), small_engine_options());
  ASSERT_TRUE(engine);
  const int64_t vocab = engine->model_config().vocab_size;
  auto rejection = [&](GenerateRequest r) { return engine->submit(std::move(r)).status(); };
  GenerateRequest ok;
  ok.prompt_token_ids = {1};
  GenerateRequest empty = ok;
  empty.prompt_token_ids.clear();
  EXPECT_NE(rejection(empty).message().find("prompt"), std::string::npos);
  GenerateRequest bad_token = ok;
  bad_token.prompt_token_ids = {static_cast<TokenId>(vocab)};
  EXPECT_NE(rejection(bad_token).message().find("outside the vocabulary"), std::string::npos);
  GenerateRequest too_long = ok;
  too_long.prompt_token_ids.assign(engine->model_config().max_context_tokens, 1);
  EXPECT_NE(rejection(too_long).message().find("context window"), std::string::npos);
  GenerateRequest bad_temperature = ok;
  bad_temperature.sampling.temperature = -1;
  EXPECT_NE(rejection(bad_temperature).message().find("temperature"), std::string::npos);
  EXPECT_EQ(rejection(bad_temperature).code(), StatusCode::kInvalidArgument);
}

TEST(EngineTest, AFullQueueRefusesNewRequests) {
  EngineOptions options = small_engine_options();
  options.scheduler.max_queued_requests = 4;
  options.scheduler.max_num_seqs = 1;  // one runs, the others queue
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), options);
  ASSERT_TRUE(engine);
  GenerateRequest request;
  request.prompt_token_ids = {1, 2, 3};
  request.sampling.max_tokens = 50;
  request.sampling.ignore_eos = true;
  std::vector<std::shared_ptr<RequestStream>> accepted;
  Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    StatusOr<std::shared_ptr<RequestStream>> stream = engine->submit(request);
    if (stream.ok()) {
      accepted.push_back(*stream);
    } else {
      refused = stream.status();
    }
  }
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << "submitting faster than it runs";
  EXPECT_GE(accepted.size(), 4u);
  for (auto& stream : accepted) collect(*stream);  // the accepted ones all finish
  EXPECT_TRUE(engine->submit(request).ok()) << "room again once the queue drained";
}

TEST(EngineTest, StopStringsAndStopTokensOnTheDefaultModel) {
  std::unique_ptr<Engine> engine = make_engine(STRATA_TEST_MODEL, EngineOptions{});
  ASSERT_TRUE(engine);
  GenerateRequest request;
  request.prompt_token_ids = engine->tokenizer().encode("The capital of France is", false);
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 32;
  GenerateRequest with_stop = request;
  with_stop.sampling.stop = {"\n"};
  const std::vector<Collected> runs = run_concurrent(*engine, {request, with_stop});
  // Greedy continuation (matches HF transformers, see executor_reference_test); it ends with
  // the end-of-text token, whose text is not shown.
  EXPECT_EQ(runs[0].text, " Paris.\n\nThe answer is: 2018-01-22 12:12:53.");
  EXPECT_EQ(runs[0].last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(runs[0].tokens.back(), 2) << "<|im_end|> is the model's eos";
  EXPECT_EQ(runs[1].text, " Paris.");
  EXPECT_EQ(runs[1].last.finish_reason, FinishReason::kStop);

  // A chat turn ends on the end-of-turn token, whose text is not shown.
  std::string chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n";
  GenerateRequest turn = request;
  turn.prompt_token_ids = engine->tokenizer().encode(chat, false);
  turn.sampling.max_tokens = 64;
  const Collected answer = run_concurrent(*engine, {turn})[0];
  EXPECT_EQ(answer.last.finish_reason, FinishReason::kStop);
  EXPECT_EQ(answer.text.find("<|im_end|>"), std::string::npos);
  expect_pool_fully_free(*engine);
}

// Teacher forcing (GenerateRequest::forced_completion): decoding a text's last tokens one step at
// a time scores them as a single forward over the whole text does (prompt logprobs), ignoring
// eos and stop strings, and with LeanKV the same protocol scores its compressed decode.
TEST(EngineTest, ForcedCompletionScoresLikeThePrompt) {
  std::unique_ptr<Engine> engine = make_engine(STRATA_TEST_MODEL, EngineOptions{});
  ASSERT_TRUE(engine);
  std::vector<TokenId> text = engine->tokenizer().encode(
      "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the "
      "clocks were striking thirteen.",
      false);
  text.push_back(2);  // the eos token inside the scored continuation
  text.push_back(text[3]);
  // Every logprob a request returns: its prompt's, then its tokens'. A forced completion never
  // stops early (the unforced request samples its one token, which may be eos).
  auto scores = [&](const GenerateRequest& request) {
    StatusOr<std::shared_ptr<RequestStream>> stream = engine->submit(request);
    EXPECT_TRUE(stream.ok()) << stream.status().to_string();
    std::vector<double> out;
    std::vector<TokenId> tokens;
    while (std::optional<RequestOutput> delta = (*stream)->next()) {
      for (const TokenOutput& t : delta->prompt_logprobs) out.push_back(t.logprob);
      for (const TokenOutput& t : delta->tokens) {
        out.push_back(t.logprob);
        tokens.push_back(t.token);
      }
      if (!request.forced_completion.empty()) {
        EXPECT_NE(delta->finish_reason, FinishReason::kStop);
      }
    }
    return std::pair{out, tokens};
  };
  GenerateRequest whole;
  whole.prompt_token_ids = text;
  whole.sampling.max_tokens = 1;
  whole.sampling.prompt_logprobs = 0;
  GenerateRequest forced;
  const size_t split = text.size() - 12;
  forced.prompt_token_ids.assign(text.begin(), text.begin() + split);
  forced.forced_completion.assign(text.begin() + split, text.end());
  forced.sampling.prompt_logprobs = 0;
  forced.sampling.stop = {"fox"};
  const auto [expected, unused] = scores(whole);
  const auto [got, tokens] = scores(forced);
  EXPECT_EQ(tokens, std::vector<TokenId>(text.begin() + split, text.end()));
  ASSERT_EQ(got.size(), text.size() - 1);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-3) << "token " << i + 1;
  forced.forced_completion[3] = 1 << 30;
  EXPECT_FALSE(engine->submit(forced).ok());
}

// LeanKV (docs/leankv.md) as a serving mode on the default model: prompts computed over chunked
// prefill are compressed when they complete and decoding reads LeanKV pages; a request's tokens do
// not depend on what it is batched with (as without LeanKV), every page comes back, and a real
// prompt still gets its greedy answer.
TEST(EngineTest, LeanKvServesBatchesLikeSoloRunsAndFreesItsPages) {
  EngineOptions options;
  options.executor.enable_prefix_caching = false;
  options.executor.leankv.enabled = true;
  options.executor.leankv.window = 16;
  options.executor.leankv.max_sequences = 8;
  options.executor.leankv.pool_bytes = int64_t{32} << 20;
  options.scheduler.max_num_batched_tokens = 64;  // prompts of up to 120 tokens are chunked
  std::unique_ptr<Engine> engine = make_engine(STRATA_TEST_MODEL, options);
  ASSERT_TRUE(engine);
  std::vector<GenerateRequest> requests = mixed_requests(4, 20000, 0, 11);
  for (GenerateRequest& r : requests) {
    r.prompt_token_ids.resize(std::max<size_t>(r.prompt_token_ids.size(), 40), 500);
    r.sampling.max_tokens = 24;
  }
  const std::vector<Collected> solo = run_solo(*engine, requests);
  const std::vector<Collected> batched = run_concurrent(*engine, requests);
  expect_same_as_solo(solo, batched);
  expect_pool_fully_free(*engine);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.leankv.failed_prompts, 0);
  EXPECT_EQ(stats.leankv.pages_used, 0) << "LeanKV pages leaked";
  EXPECT_GT(stats.leankv.num_pages, 0);

  GenerateRequest question;
  question.prompt_token_ids = engine->tokenizer().encode("The capital of France is", false);
  question.sampling.temperature = 0;
  question.sampling.max_tokens = 3;
  EXPECT_EQ(run_solo(*engine, {question})[0].text, " Paris.\n");

  // Per request: compress_kv false keeps a request on the pool (LeanKV's baseline), with the
  // tokens of an engine without LeanKV.
  EngineOptions dense_options = options;
  dense_options.executor.leankv = {};
  std::unique_ptr<Engine> dense = make_engine(STRATA_TEST_MODEL, dense_options);
  ASSERT_TRUE(dense);
  GenerateRequest baseline = requests[2];
  baseline.compress_kv = false;
  const int64_t ended_before = engine->stats().leankv.ended_sequences;
  const std::vector<Collected> kept = run_solo(*engine, {baseline});
  expect_same_as_solo(run_solo(*dense, {baseline}), kept);
  expect_pool_fully_free(*engine);
  EXPECT_EQ(engine->stats().leankv.ended_sequences, ended_before) << "the request was compressed";
}

// Four prompts of at least 200 tokens (short ones padded with `pad`, or with random tokens when
// it is negative), 24 greedy tokens each, served one at a time and then all at once by an engine
// with `options`: the same tokens either way, and the pool whole again. Returns the engine.
std::unique_ptr<Engine> expect_batches_like_solo(const EngineOptions& options, int pad) {
  std::unique_ptr<Engine> engine = make_engine(STRATA_TEST_MODEL, options);
  EXPECT_TRUE(engine);
  if (!engine) return nullptr;
  std::vector<GenerateRequest> requests = mixed_requests(4, 20000, 0, 13);
  std::mt19937 rng(7);
  for (GenerateRequest& r : requests) {
    while (r.prompt_token_ids.size() < 200) {
      r.prompt_token_ids.push_back(static_cast<TokenId>(pad >= 0 ? pad : rng() % 20000));
    }
    r.sampling.max_tokens = 24;
  }
  const std::vector<Collected> solo = run_solo(*engine, requests);
  const std::vector<Collected> batched = run_concurrent(*engine, requests);
  expect_same_as_solo(solo, batched);
  expect_pool_fully_free(*engine);
  return engine;
}

// FreeKV (docs/freekv.md) as a serving mode: a sequence whose context reaches the threshold
// leaves the pool after its prompt and decodes by retrieval; a request's tokens do not depend on
// what it is batched with, the pool comes back whole, and a real prompt gets its greedy answer.
TEST(EngineTest, FreeKvServesBatchesLikeSoloRunsOffThePool) {
  EngineOptions options;
  options.executor.enable_prefix_caching = false;
  options.executor.freekv = {.enabled = true, .page_tokens = 16, .budget_tokens = 32 + 32 + 16 * 4,
                             .sink_tokens = 32, .window_tokens = 32, .tau = 0.8,
                             .min_context_tokens = 4};
  options.scheduler.max_num_batched_tokens = 64;  // prompts of up to 200 tokens are chunked
  std::unique_ptr<Engine> engine = expect_batches_like_solo(options, 500);
  ASSERT_TRUE(engine);
  const EngineStats stats = engine->stats();
  // Every decode step after a prompt, of 29 retrieving layers and 3 KV heads, in both runs.
  EXPECT_EQ(stats.freekv.head_steps, 2 * 4 * 23 * 29 * 3);
  EXPECT_GT(stats.freekv.recalled_pages, 0);
  EXPECT_EQ(stats.freekv.sequences, 0) << "FreeKV state leaked";

  GenerateRequest question;
  question.prompt_token_ids = engine->tokenizer().encode("The capital of France is", false);
  question.sampling.temperature = 0;
  question.sampling.max_tokens = 3;
  EXPECT_EQ(run_solo(*engine, {question})[0].text, " Paris.\n");
}

// H2O (freekv.method h2o): prompts observed chunk by chunk beside other sequences' chunks in one
// pass, then decoded off the pool with evictions; batched equals solo.
TEST(EngineTest, H2oServesBatchesLikeSoloRunsOffThePool) {
  EngineOptions options;
  options.executor.enable_prefix_caching = false;
  // 32 recent tokens and 32 heavy hitters per layer and KV head: the choice of heavy hitters
  // decides the answers (observing another sequence's rows of a pass, a tested mutation, fails).
  options.executor.freekv = {.enabled = true, .method = executor::FreeKvMethod::kH2o,
                             .page_tokens = 16, .budget_tokens = 64, .sink_tokens = 0,
                             .window_tokens = 32, .min_context_tokens = 4};
  options.scheduler.max_num_batched_tokens = 256;  // several prompts' chunks in one pass
  std::unique_ptr<Engine> engine = expect_batches_like_solo(options, /*pad=*/-1);
  ASSERT_TRUE(engine);
  const EngineStats stats = engine->stats();
  // Every decode step after a prompt, of 29 evicting layers and 3 KV heads, in both runs.
  EXPECT_EQ(stats.freekv.head_steps, 2 * 4 * 23 * 29 * 3);
  EXPECT_EQ(stats.freekv.recalled_pages, 0);
  EXPECT_EQ(stats.freekv.sequences, 0) << "H2O state leaked";
}

// LeanKV's capacity: a compressed sequence gives its pool blocks back and decodes without new
// ones, so a pool that holds two of these conversations serves six at once. With LeanKV's pages
// short, a sequence is preempted to recompute and comes back on the pool; every request still
// finishes and nothing leaks.
TEST(EngineTest, LeanKvFreesThePoolSoMoreConversationsRunAtOnce) {
  EngineOptions options;
  options.executor.enable_prefix_caching = false;
  options.executor.max_context_tokens = 256;
  // One full context: 16 token blocks of 30 layers, fp32 K and V of 3 heads x 64 x 16 tokens.
  options.executor.cache_bytes = int64_t{16} * 30 * (2 * 3 * 64 * 16 * 4);
  options.executor.leankv.enabled = true;
  options.executor.leankv.window = 16;
  options.executor.leankv.max_sequences = 8;
  options.executor.leankv.pool_bytes = int64_t{32} << 20;
  options.scheduler.max_num_batched_tokens = 64;
  auto requests = [](int n, int prompt, int output) {
    std::vector<GenerateRequest> out = mixed_requests(n, 20000, 0, 5);
    for (GenerateRequest& r : out) {
      r.prompt_token_ids.resize(prompt, 700);
      r.sampling.max_tokens = output;
    }
    return out;
  };
  // 100 + 12 tokens: 7 blocks of every layer, so the pool holds two such sequences.
  const std::vector<GenerateRequest> six = requests(6, 100, 12);
  std::unique_ptr<Engine> engine = make_engine(STRATA_TEST_MODEL, options);
  ASSERT_TRUE(engine);
  for (const Collected& c : run_concurrent(*engine, six)) {
    EXPECT_EQ(c.last.finish_reason, FinishReason::kLength) << c.last.error;
    EXPECT_EQ(c.tokens.size(), 12u);
  }
  expect_pool_fully_free(*engine);
  EngineStats stats = engine->stats();
  EXPECT_EQ(stats.peak_running, 6);
  EXPECT_EQ(stats.num_preemptions, 0);
  EXPECT_EQ(stats.leankv.failed_prompts, 0);
  EXPECT_EQ(stats.leankv.pages_used, 0) << "LeanKV pages leaked";

  EngineOptions dense_options = options;
  dense_options.executor.leankv = {};
  std::unique_ptr<Engine> dense = make_engine(STRATA_TEST_MODEL, dense_options);
  ASSERT_TRUE(dense);
  for (const Collected& c : run_concurrent(*dense, six)) {
    EXPECT_EQ(c.last.finish_reason, FinishReason::kLength) << c.last.error;
  }
  EXPECT_LE(dense->stats().peak_running, 3);

  // 640 pages (~2.2 MiB) take two compressed prompts beside their reserve; nothing is pruned
  // (alpha_low 0), so 60 decoded tokens per sequence outgrow the pages and force a preemption.
  options.executor.leankv.pool_bytes = 640 * 3584;
  *options.executor.cache_bytes *= 3;  // holds both sequences: only LeanKV's pages run short
  options.executor.leankv.alpha_low = 0;
  std::unique_ptr<Engine> short_pages = make_engine(STRATA_TEST_MODEL, options);
  ASSERT_TRUE(short_pages);
  for (const Collected& c : run_concurrent(*short_pages, requests(2, 100, 60))) {
    EXPECT_EQ(c.last.finish_reason, FinishReason::kLength) << c.last.error;
    EXPECT_EQ(c.tokens.size(), 60u);
  }
  expect_pool_fully_free(*short_pages);
  stats = short_pages->stats();
  // One: the preempted sequence comes back on the pool, not compressed into the same shortage.
  EXPECT_EQ(stats.num_preemptions, 1);
  EXPECT_EQ(stats.leankv.failed_prompts, 0);
  EXPECT_EQ(stats.leankv.pages_used, 0) << "LeanKV pages leaked";
}

// Prompt scoring (perplexity): the engine's prompt logprobs, computed over chunked prefill, equal
// HF transformers' log-softmax of one full forward (tests/reference/model_reference.py).
TEST(EngineTest, PromptLogprobsMatchHfOverChunkedPrefill) {
  std::ifstream in(std::string(STRATA_TEST_DATA_DIR) + "/model/smollm2/prompt_logprobs.json");
  ASSERT_TRUE(in) << "run the model_reference fixture first";
  const nlohmann::json reference = nlohmann::json::parse(in);
  const auto ids = reference["prompt_ids"].get<std::vector<TokenId>>();
  const auto hf = reference["logprobs"].get<std::vector<double>>();
  ASSERT_EQ(hf.size() + 1, ids.size());

  EngineOptions options;
  options.scheduler.max_num_batched_tokens = 128;  // ~6 prefill chunks
  std::unique_ptr<Engine> engine = make_engine(STRATA_TEST_MODEL, options);
  ASSERT_TRUE(engine);
  GenerateRequest request;
  request.prompt_token_ids = ids;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 2;
  request.sampling.prompt_logprobs = 3;
  // Twice: the second run's prompt is in the prefix cache, and must be scored all the same.
  for (int run = 0; run < 2; ++run) {
    StatusOr<std::shared_ptr<RequestStream>> stream = engine->submit(request);
    ASSERT_TRUE(stream.ok()) << stream.status().to_string();
    std::vector<TokenOutput> scored;
    int deltas_with_prompt = 0;
    while (std::optional<RequestOutput> out = (*stream)->next()) {
      if (!out->prompt_logprobs.empty()) ++deltas_with_prompt;
      scored.insert(scored.end(), out->prompt_logprobs.begin(), out->prompt_logprobs.end());
    }
    EXPECT_EQ(deltas_with_prompt, 1) << "prompt logprobs come once, with the first token";
    ASSERT_EQ(scored.size(), hf.size());
    double max_diff = 0, nll = 0, hf_nll = 0;
    for (size_t i = 0; i < hf.size(); ++i) {
      EXPECT_EQ(scored[i].token, ids[i + 1]);
      max_diff = std::max(max_diff, std::abs(scored[i].logprob - hf[i]));
      nll -= scored[i].logprob;
      hf_nll -= hf[i];
      ASSERT_EQ(scored[i].top_logprobs.size(), 3u);
      EXPECT_GE(scored[i].top_logprobs[0].logprob, scored[i].top_logprobs[1].logprob);
      EXPECT_GE(scored[i].top_logprobs[0].logprob + 1e-6, scored[i].logprob);
    }
    EXPECT_LE(max_diff, 1e-3) << "run " << run;
    EXPECT_NEAR(std::exp(nll / hf.size()), std::exp(hf_nll / hf.size()), 1e-3) << "perplexity";
  }
  EXPECT_EQ(engine->stats().prefix_hit_tokens, 0) << "scored prompts compute every token";
  expect_pool_fully_free(*engine);
}

TEST(EngineTest, PromptLogprobsAreRejectedOutOfRangeOrForAPromptThatWouldBeTruncated) {
  EngineOptions options = small_engine_options();
  options.scheduler.overflow_truncation_fraction = 0.5;
  std::unique_ptr<Engine> engine = make_engine(tiny_qwen2_path(), options);
  ASSERT_TRUE(engine);
  GenerateRequest request;
  request.prompt_token_ids = {1, 2, 3};
  request.sampling.prompt_logprobs = 21;
  StatusOr<std::shared_ptr<RequestStream>> stream = engine->submit(request);
  ASSERT_FALSE(stream.ok());
  EXPECT_TRUE(stream.status().message().starts_with("prompt_logprobs"))
      << stream.status().message();
  request.sampling.prompt_logprobs = 0;
  request.prompt_token_ids.assign(engine->model_config().max_context_tokens, 5);
  stream = engine->submit(request);
  ASSERT_FALSE(stream.ok());
  EXPECT_TRUE(stream.status().message().starts_with("prompt_logprobs"))
      << stream.status().message();
}

}  // namespace
}  // namespace strata::engine
