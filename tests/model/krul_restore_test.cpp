// Krul's restoration in the executor (SequenceChunk::restored_tokens, computed_rows) on the
// default model (fp32, CPU): a resumed turn whose layers each recompute a prefix of the history
// (never longer than the layer above's) and load the rest from saved chunks, in the same pass as
// the new turn, gives the logits of recomputing everything, and so do the decode steps after it
// (they read the loaded KV). Plans from recompute-all to load-all, pyramids and random ones.
// Invalid plans are refused before anything runs. Loads streamed beside the pass (KvLoad::arrivals:
// chunks arriving layer by layer from another thread while the layers run) give the same logits,
// and a layer that never arrives names its sequence in ForwardResult::failed_loads. A chunk
// observing attention beside a restoring one observes its own rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::executor {
namespace {

constexpr int64_t kHistoryBlocks = 8;
constexpr int64_t kTurnTokens = 9;

// Chunks that arrive layer by layer from a thread of their own (as the restore coordinator reads
// them) into buffers that hold NaN until then. A layer arrives a millisecond after the executor
// first waits for it, never before: a layer copied without its own wait poisons the logits. From
// layer `fail_at` on nothing arrives.
class DelayedArrivals final : public ChunkArrivals {
 public:
  DelayedArrivals(const std::vector<const std::byte*>& chunks, int64_t chunk_bytes,
                  int64_t num_layers, int64_t fail_at) {
    for (size_t j = 0; j < chunks.size(); ++j) {
      buffers_.emplace_back(static_cast<size_t>(chunk_bytes), std::byte{0xff});  // NaN
    }
    const int64_t layer_bytes = chunk_bytes / num_layers;
    thread_ = std::thread([this, chunks, layer_bytes, num_layers, fail_at] {
      std::unique_lock lock(mutex_);
      for (int64_t l = 0; l < num_layers && l != fail_at; ++l) {
        changed_.wait(lock, [&] { return asked_ > l || stopping_; });
        if (stopping_) break;
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
        for (size_t j = 0; j < chunks.size(); ++j) {
          std::memcpy(buffers_[j].data() + l * layer_bytes, chunks[j] + l * layer_bytes,
                      static_cast<size_t>(layer_bytes));
        }
        layers_ = l + 1;
        changed_.notify_all();
      }
      done_ = true;
      changed_.notify_all();
    });
  }
  ~DelayedArrivals() override {
    {
      std::scoped_lock lock(mutex_);
      stopping_ = true;
      changed_.notify_all();
    }
    thread_.join();
  }
  const std::byte* wait(int64_t j, int64_t layer) const override {
    std::unique_lock lock(mutex_);
    asked_ = std::max(asked_, layer + 1);
    changed_.notify_all();
    changed_.wait(lock, [&] { return layers_ > layer || done_; });
    return layers_ > layer ? buffers_[j].data() : nullptr;
  }

 private:
  std::vector<std::vector<std::byte>> buffers_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  mutable int64_t asked_ = 0;  // layers [0, asked_) were waited for
  int64_t layers_ = 0;         // arrived: layers [0, layers_) of every chunk
  bool stopping_ = false;
  bool done_ = false;
  std::thread thread_;
};

constexpr int64_t kNeverFails = -1;

class KrulRestoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    source_ = model::open_model_source(STRATA_TEST_MODEL).value().release();
    tokenizer::Tokenizer* tok = tokenizer::Tokenizer::from_gguf(*source_->gguf()).value().release();
    std::ifstream in(STRATA_SOURCE_DIR "/../shared/data/ppl/wikitext-2-raw-v1_test.raw");
    std::stringstream text;
    text << in.rdbuf();
    prompt_ = tok->encode(text.str().substr(20000, 4000), false);
    delete tok;
    ExecutorOptions options;
    options.cache_bytes = int64_t{400} << 20;
    executor_ = Executor::create(*source_, options).value().release();
    block_ = executor_->kv_geometry().block_size_tokens;
    ASSERT_GE(std::ssize(prompt_), kHistoryBlocks * block_ + kTurnTokens) << "WikiText-2 missing";
    prompt_.resize(kHistoryBlocks * block_ + kTurnTokens);
  }
  static void TearDownTestSuite() {
    delete executor_;
    delete source_;
  }

  void SetUp() override {
    kv_ = std::make_unique<kv::KvCacheManager>(executor_->kv_geometry(), executor_->kv_format(),
                                               kv::PrefixCacheOptions{false, 0});
    // The previous turn: the history computed with its blocks saved, then dropped.
    const std::vector<TokenId> history(prompt_.begin(), prompt_.begin() + history_tokens());
    ASSERT_TRUE(kv_->add_sequence(SeqId{1}, history, "").ok());
    saved_.assign(kHistoryBlocks, std::vector<std::byte>(executor_->kv_chunk_bytes()));
    ForwardBatch batch = chunk_of(SeqId{1}, history_tokens(), LogitsMode::kNone);
    KvSave& save = batch.saves.emplace_back(KvSave{SeqId{1}, 0, {}});
    for (auto& c : saved_) save.chunks.push_back(c.data());
    StatusOr<ForwardResult> result = executor_->forward(batch);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    if (result->saves_written) result->saves_written();
    kv_->free(SeqId{1});
  }

  static int64_t history_tokens() { return kHistoryBlocks * block_; }

  // A pass of the next n tokens of `seq` (its blocks allocated); the caller fills in the rest.
  ForwardBatch chunk_of(SeqId seq, int64_t n, LogitsMode mode) {
    StatusOr<kv::KvPlan> plan = kv_->prepare({{seq, n}});
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    ForwardBatch batch;
    kv_->commit(std::move(plan).value(), &batch.copies);
    const int64_t start = kv_->num_computed_tokens(seq);
    const std::vector<TokenId>& t = kv_->tokens(seq);
    batch.chunks.push_back({seq, std::vector<TokenId>(t.begin() + start, t.begin() + start + n),
                            start, kv_->tables(seq), mode});
    return batch;
  }

  // Loads of the saved history blocks [first, kHistoryBlocks); streamed: every chunk arrives
  // during the pass layer by layer (DelayedArrivals), from layer `fail_at` on never.
  KvLoad load_from(SeqId seq, int64_t first, bool streamed = false, int64_t fail_at = kNeverFails) {
    KvLoad load{seq, first, {}, std::nullopt};
    for (int64_t b = first; b < kHistoryBlocks; ++b) load.chunks.push_back(saved_[b].data());
    if (streamed) {
      load.arrivals = std::make_shared<DelayedArrivals>(load.chunks, executor_->kv_chunk_bytes(),
                                                        executor_->config().num_layers, fail_at);
      std::ranges::fill(load.chunks, nullptr);
    }
    return load;
  }

  // The whole prompt in one pass (restored by `computed_rows` when given, its loads streamed or
  // not), then `steps` greedy decode steps: the logits of each.
  std::vector<std::vector<float>> resume(SeqId seq, const std::vector<int64_t>& computed_rows,
                                         int steps, bool streamed = false) {
    EXPECT_TRUE(kv_->add_sequence(seq, prompt_, "").ok());
    ForwardBatch batch = chunk_of(seq, std::ssize(prompt_), LogitsMode::kLast);
    if (!computed_rows.empty()) {
      batch.chunks[0].restored_tokens = history_tokens();
      batch.chunks[0].computed_rows = computed_rows;
      batch.loads.push_back(load_from(seq, computed_rows.back() / block_, streamed));
    }
    std::vector<std::vector<float>> logits;
    StatusOr<ForwardResult> result = executor_->forward(batch);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    if (!result.ok()) return logits;
    EXPECT_TRUE(result->failed_loads.empty());
    kv_->mark_computed(seq, std::ssize(prompt_));
    logits.push_back(result->logits);
    for (int s = 0; s < steps; ++s) {
      const std::vector<float>& last = logits.back();
      const auto token = static_cast<TokenId>(std::max_element(last.begin(), last.end()) - last.begin());
      kv_->append_tokens(seq, std::vector<TokenId>{token});
      StatusOr<ForwardResult> step = executor_->forward(chunk_of(seq, 1, LogitsMode::kLast));
      EXPECT_TRUE(step.ok()) << step.status().to_string();
      if (!step.ok()) return logits;
      kv_->mark_computed(seq, 1);
      logits.push_back(step->logits);
    }
    kv_->free(seq);
    return logits;
  }

  static inline model::ModelSource* source_ = nullptr;
  static inline Executor* executor_ = nullptr;
  static inline std::vector<TokenId> prompt_;
  static inline int64_t block_ = 16;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::vector<std::vector<std::byte>> saved_;
};

TEST_F(KrulRestoreTest, EveryValidPlanRestoresTheLogitsOfRecomputing) {
  const int64_t layers = executor_->config().num_layers;
  const int64_t history = history_tokens();
  const std::vector<std::vector<float>> reference = resume(SeqId{2}, {}, 4);
  ASSERT_EQ(reference.size(), 5u);

  std::vector<std::vector<int64_t>> plans = {
      std::vector<int64_t>(layers, history),  // recompute all
      std::vector<int64_t>(layers, 0),        // load all (full load)
  };
  std::vector<int64_t> pyramid(layers), step(layers, 0);
  for (int64_t l = 0; l < layers; ++l) {
    pyramid[l] = (kHistoryBlocks - l * kHistoryBlocks / layers) * block_ - block_;
    if (l < layers / 3) step[l] = history / 2;
  }
  plans.push_back(pyramid);
  plans.push_back(step);
  std::mt19937 rng(7);
  for (int r = 0; r < 3; ++r) {  // random non-increasing whole-block plans
    std::vector<int64_t> blocks(layers);
    for (int64_t& b : blocks) b = std::uniform_int_distribution<int64_t>(0, kHistoryBlocks)(rng);
    std::sort(blocks.rbegin(), blocks.rend());
    std::vector<int64_t> plan;
    for (int64_t b : blocks) plan.push_back(b * block_);
    plans.push_back(plan);
  }
  ASSERT_TRUE(executor_->streams_loads());
  uint64_t seq = 10;
  for (const std::vector<int64_t>& plan : plans) {
    for (const bool streamed : {false, true}) {
      std::ostringstream name;
      for (int64_t n : plan) name << n / block_;
      SCOPED_TRACE("blocks computed per layer: " + name.str() + (streamed ? ", streamed" : ""));
      const std::vector<std::vector<float>> restored = resume(SeqId{seq++}, plan, 4, streamed);
      ASSERT_EQ(restored.size(), reference.size());
      for (size_t s = 0; s < reference.size(); ++s) {
        ASSERT_EQ(restored[s].size(), reference[s].size());
        float max_diff = 0;
        for (size_t i = 0; i < reference[s].size(); ++i) {
          const float d = std::abs(reference[s][i] - restored[s][i]);
          max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);  // NaN fails
        }
        EXPECT_LT(max_diff, 1e-3) << "pass " << s;
      }
    }
  }
}

// A chunk that observes attention (Krul's statistics) in a pass beside a restoring chunk
// observes its own rows: the restoring chunk's layers compute fewer rows than it has tokens, so
// the observed chunk's rows start earlier in those layers' queries than in the batch. Its
// statistics equal those of the same chunk observed alone, in either order in the batch.
TEST_F(KrulRestoreTest, AChunkObservedBesideARestorationObservesItsOwnRows) {
  const int64_t layers = executor_->config().num_layers;
  const std::vector<TokenId> other(prompt_.begin() + 3, prompt_.begin() + 43);
  std::vector<int64_t> pyramid(layers);
  for (int64_t l = 0; l < layers; ++l) pyramid[l] = std::max<int64_t>(0, 4 - l / 8) * block_;
  const auto observed_chunk = [&](SeqId seq) {
    SequenceChunk c{seq, other, 0, kv_->tables(seq), LogitsMode::kLast};
    c.observe_attention = true;
    c.observe_row_stride = 1;
    return c;
  };
  ASSERT_TRUE(kv_->add_sequence(SeqId{30}, other, "").ok());
  ForwardBatch alone = chunk_of(SeqId{30}, std::ssize(other), LogitsMode::kLast);
  alone.chunks[0] = observed_chunk(SeqId{30});
  ASSERT_TRUE(executor_->forward(alone).ok());
  const std::optional<kv::krul::AttentionStats> want = executor_->take_attention_stats(SeqId{30});
  ASSERT_TRUE(want.has_value());
  kv_->free(SeqId{30});
  uint64_t seq = 31;
  for (const bool restoring_first : {true, false}) {
    SCOPED_TRACE(restoring_first ? "restoring chunk first" : "observed chunk first");
    const SeqId restoring{seq++}, observed{seq++};
    ASSERT_TRUE(kv_->add_sequence(restoring, prompt_, "").ok());
    ASSERT_TRUE(kv_->add_sequence(observed, other, "").ok());
    StatusOr<kv::KvPlan> plan =
        kv_->prepare({{restoring, std::ssize(prompt_)}, {observed, std::ssize(other)}});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ForwardBatch batch;
    kv_->commit(std::move(plan).value(), &batch.copies);
    SequenceChunk restore{restoring, prompt_, 0, kv_->tables(restoring), LogitsMode::kLast};
    restore.restored_tokens = history_tokens();
    restore.computed_rows = pyramid;
    batch.chunks.push_back(restore);
    batch.chunks.push_back(observed_chunk(observed));
    if (!restoring_first) std::swap(batch.chunks[0], batch.chunks[1]);
    batch.loads.push_back(load_from(restoring, 0));
    StatusOr<ForwardResult> result = executor_->forward(batch);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    const std::optional<kv::krul::AttentionStats> got = executor_->take_attention_stats(observed);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->observed, want->observed);
    for (int32_t l = 0; l < layers; ++l) {
      EXPECT_NEAR(got->edge_share(l), want->edge_share(l), 1e-5) << "layer " << l;
    }
    double worst = 0;
    for (size_t i = 0; i < want->squared.size(); ++i) {
      worst = std::max(worst, std::abs(got->squared[i] - want->squared[i]) /
                                  std::max(std::abs(want->squared[i]), 1e-6));
    }
    EXPECT_LT(worst, 1e-3) << "the squared distances of another chunk's rows";
    kv_->free(restoring);
    kv_->free(observed);
  }
}

TEST_F(KrulRestoreTest, AStreamedChunkThatNeverArrivesNamesItsSequence) {
  const int64_t layers = executor_->config().num_layers;
  std::vector<int64_t> pyramid(layers);
  for (int64_t l = 0; l < layers; ++l) {
    pyramid[l] = (kHistoryBlocks - l * kHistoryBlocks / layers) * block_ - block_;
  }
  // From the first layer on, from a middle one on, the last one only: the pass runs to its end.
  for (const int64_t fail_at : {int64_t{0}, layers / 2, layers - 1}) {
    SCOPED_TRACE("layers from " + std::to_string(fail_at) + " on never arrive");
    const SeqId seq{static_cast<uint64_t>(20 + fail_at)};
    ASSERT_TRUE(kv_->add_sequence(seq, prompt_, "").ok());
    ForwardBatch batch = chunk_of(seq, std::ssize(prompt_), LogitsMode::kLast);
    batch.chunks[0].restored_tokens = history_tokens();
    batch.chunks[0].computed_rows = pyramid;
    batch.loads.push_back(load_from(seq, 0, /*streamed=*/true, fail_at));
    StatusOr<ForwardResult> result = executor_->forward(batch);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    EXPECT_EQ(result->failed_loads, std::vector<SeqId>{seq});
    kv_->free(seq);
  }
}

TEST_F(KrulRestoreTest, InvalidPlansAreRefused) {
  const int64_t layers = executor_->config().num_layers;
  const int64_t history = history_tokens();
  ASSERT_TRUE(kv_->add_sequence(SeqId{3}, prompt_, "").ok());
  auto attempt = [&](std::vector<int64_t> plan, int64_t restored, int64_t first_loaded,
                     LogitsMode mode) {
    ForwardBatch batch = chunk_of(SeqId{3}, std::ssize(prompt_), mode);
    batch.chunks[0].restored_tokens = restored;
    batch.chunks[0].computed_rows = std::move(plan);
    if (first_loaded < kHistoryBlocks) batch.loads.push_back(load_from(SeqId{3}, first_loaded));
    return executor_->forward(batch).status();
  };
  std::vector<int64_t> growing(static_cast<size_t>(layers) - 1, 0);
  growing.push_back(block_);  // the last layer computes more than the one above
  const std::vector<int64_t> none(layers, 0);
  std::vector<int64_t> partial_block(layers, 0);
  partial_block[0] = block_ / 2;
  const struct {
    const char* what;
    Status status;
    const char* message;
  } cases[] = {
      {"a deeper layer computes more", attempt(growing, history, 0, LogitsMode::kLast),
       "never more than the layer above"},
      {"part of a block", attempt(partial_block, history, 0, LogitsMode::kLast), "whole blocks"},
      {"an unloaded history block", attempt(none, history, 1, LogitsMode::kLast),
       "no load brings history block 0"},
      {"no new token", attempt(none, std::ssize(prompt_), 0, LogitsMode::kLast),
       "at least one new token"},
      {"a history that is not whole blocks", attempt(none, history - 1, 0, LogitsMode::kLast),
       "whole blocks"},
      {"every row's logits", attempt(none, history, 0, LogitsMode::kAll),
       "logits of the new tokens only"},
      {"a plan per layer", attempt({0}, history, 0, LogitsMode::kLast), "one computed_rows entry"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.status.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(c.status.message().find(c.message), std::string::npos)
        << c.what << ": " << c.status.message();
  }
}

}  // namespace
}  // namespace strata::executor
