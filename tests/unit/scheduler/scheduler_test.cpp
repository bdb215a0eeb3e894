// Table-driven scheduler tests: each case lists, step by step, the sequences added before the
// step, and the chunks (seq, start, tokens, samples) and preemptions the step must produce. The
// harness plays the engine: it marks chunks computed and appends one sampled token per sampling
// chunk. KV: 1 layer, 4-token blocks, so a pool of N blocks holds 4N tokens.

#include "strata/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <sstream>

namespace strata::scheduler {
namespace {

struct Add {
  uint64_t seq;
  int prompt_tokens;
  int32_t priority = 0;
};
struct Chunk {
  uint64_t seq;
  int64_t start;
  int64_t tokens;
  bool samples;
  bool operator==(const Chunk&) const = default;
};
struct Step {
  std::vector<Add> adds;
  std::vector<Chunk> chunks;
  std::vector<uint64_t> preempted = {};
  std::vector<uint64_t> removes_after = {};  // finished or cancelled after the step
};
struct Case {
  const char* name;
  int32_t max_num_seqs;
  int64_t max_num_batched_tokens;
  int32_t num_blocks;
  std::vector<Step> steps;
};

std::string describe(const std::vector<Chunk>& chunks) {
  std::ostringstream out;
  for (const Chunk& c : chunks) {
    out << "(" << c.seq << "," << c.start << "," << c.tokens << "," << (c.samples ? "T" : "F")
        << ") ";
  }
  return out.str();
}

std::vector<TokenId> iota_prompt(TokenId first, int n) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// One step as the engine runs it: schedule, mark computed, one sampled token per sampling chunk.
ScheduledBatch run_step(Scheduler& scheduler, kv::KvCacheManager& kv, TokenId& next_token) {
  ScheduledBatch batch = scheduler.schedule();
  scheduler.on_batch_done(batch);
  for (const ScheduledChunk& c : batch.chunks) {
    if (c.samples) kv.append_tokens(c.seq, std::vector<TokenId>{next_token++});
  }
  return batch;
}

void run_case(const Case& c) {
  kv::KvCacheManager kv({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8,
                         .block_size_tokens = 4, .num_blocks = c.num_blocks},
                        {}, {});
  Scheduler scheduler({.max_num_seqs = c.max_num_seqs,
                       .max_num_batched_tokens = c.max_num_batched_tokens},
                      kv);
  TokenId next_token = 1000;
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const Step& step = c.steps[i];
    SCOPED_TRACE(std::string(c.name) + ", step " + std::to_string(i + 1));
    for (const Add& add : step.adds) {
      std::vector<TokenId> prompt(add.prompt_tokens);
      // Distinct tokens per sequence so prefixes are not shared by accident.
      std::iota(prompt.begin(), prompt.end(), static_cast<TokenId>(add.seq * 100));
      ASSERT_TRUE(scheduler.add(SeqId{add.seq}, prompt, add.priority, "").ok());
    }
    ScheduledBatch batch = scheduler.schedule();
    std::vector<Chunk> got;
    for (const ScheduledChunk& ch : batch.chunks) {
      got.push_back({ch.seq.value, ch.start_position, ch.num_tokens, ch.samples});
    }
    EXPECT_EQ(got, step.chunks) << "got " << describe(got) << "expected " << describe(step.chunks);
    std::vector<uint64_t> preempted;
    for (SeqId s : batch.preempted) preempted.push_back(s.value);
    EXPECT_EQ(preempted, step.preempted);
    scheduler.on_batch_done(batch);
    for (const ScheduledChunk& ch : batch.chunks) {
      if (ch.samples) kv.append_tokens(ch.seq, std::vector<TokenId>{next_token++});
    }
    for (uint64_t s : step.removes_after) scheduler.remove(SeqId{s});
  }
  // Finish everything: the pool must be whole again.
  for (uint64_t s = 0; s < 100; ++s) scheduler.remove(SeqId{s});
  EXPECT_EQ(kv.num_available_blocks(), c.num_blocks) << c.name << ": KV blocks leaked";
}

TEST(SchedulerTest, Table) {
  const std::vector<Case> cases = {
      {"chunked prefill under the token budget", 8, 8, 64,
       {{{{1, 20}}, {{1, 0, 8, false}}},
        {{}, {{1, 8, 8, false}}},
        {{}, {{1, 16, 4, true}}},
        {{}, {{1, 20, 1, true}}}}},
      {"a new prompt joins running decodes every step", 8, 8, 64,
       {{{{1, 3}}, {{1, 0, 3, true}}},
        {{{2, 10}}, {{1, 3, 1, true}, {2, 0, 7, false}}},
        {{}, {{1, 4, 1, true}, {2, 7, 3, true}}},
        {{}, {{1, 5, 1, true}, {2, 10, 1, true}}}}},
      {"max_num_seqs caps the batch; finished sequences make room", 2, 64, 64,
       {{{{1, 2}, {2, 2}, {3, 2}}, {{1, 0, 2, true}, {2, 0, 2, true}}},
        {{}, {{1, 2, 1, true}, {2, 2, 1, true}}, {}, {1}},
        {{}, {{2, 3, 1, true}, {3, 0, 2, true}}}}},
      {"FCFS: a prompt that does not fit blocks later ones", 8, 64, 4,
       {{{{1, 8}}, {{1, 0, 8, true}}},
        {{{2, 12}, {3, 2}}, {{1, 8, 1, true}}},
        {{}, {{1, 9, 1, true}}, {}, {1}},
        {{}, {{2, 0, 12, true}, {3, 0, 2, true}}}}},
      {"preempt the latest arrival when decodes outgrow the pool", 8, 64, 4,
       {{{{1, 8}, {2, 8}}, {{1, 0, 8, true}, {2, 0, 8, true}}},
        {{}, {{1, 8, 1, true}}, {2}},
        // Sequence 2 must recompute 9 tokens (3 blocks); only 1 block is left: it waits.
        {{}, {{1, 9, 1, true}}},
        {{}, {{1, 10, 1, true}}, {}, {1}},
        // Sequence 1's blocks were cached; recomputing sequence 2 finds its own first block gone
        // (evicted for sequence 1's growth) and recomputes all 9 tokens.
        {{}, {{2, 0, 9, true}}}}},
      {"a higher priority arrival preempts a lower priority runner", 8, 64, 4,
       {{{{1, 12, 5}}, {{1, 0, 12, true}}},
        {{{2, 8, 0}}, {{2, 0, 8, true}}, {1}},
        {{}, {{2, 8, 1, true}}}}},
  };
  for (const Case& c : cases) run_case(c);
}

TEST(SchedulerTest, SwapPreemptionResumesWithoutRecomputing) {
  kv::KvCacheManager kv({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8,
                         .block_size_tokens = 4, .num_blocks = 4, .num_host_blocks = 8},
                        {}, {});
  Scheduler scheduler({.max_num_seqs = 8, .max_num_batched_tokens = 64,
                       .preemption_mode = PreemptionMode::kSwap},
                      kv);
  ASSERT_TRUE(scheduler.add(SeqId{1}, iota_prompt(100, 8), 0, "").ok());
  ASSERT_TRUE(scheduler.add(SeqId{2}, iota_prompt(200, 8), 0, "").ok());
  TokenId next = 1000;
  auto run = [&] { return run_step(scheduler, kv, next); };
  ASSERT_EQ(run().chunks.size(), 2u);
  ScheduledBatch second = run();  // both need a third block: sequence 2 is swapped out
  ASSERT_EQ(second.preempted, std::vector<SeqId>{SeqId{2}});
  EXPECT_EQ(second.copies.swap_out.size(), 2u);
  EXPECT_TRUE(kv.is_swapped(SeqId{2}));
  EXPECT_EQ(scheduler.num_swapped(), 1u);
  ScheduledBatch third = run();  // no room to bring it back while sequence 1 grows
  ASSERT_EQ(third.chunks.size(), 1u);
  scheduler.remove(SeqId{1});
  ScheduledBatch fourth = run();
  ASSERT_EQ(fourth.chunks.size(), 1u);
  EXPECT_EQ(fourth.chunks[0].seq, SeqId{2});
  EXPECT_EQ(fourth.chunks[0].start_position, 8) << "resumed, not recomputed";
  EXPECT_EQ(fourth.chunks[0].num_tokens, 1);
  EXPECT_EQ(fourth.copies.swap_in.size(), 2u);
  EXPECT_EQ(scheduler.num_swap_outs(), 1);
  scheduler.remove(SeqId{2});
  EXPECT_EQ(kv.num_available_blocks(), 4);
  EXPECT_EQ(kv.num_free_host_blocks(), 8);
}

TEST(SchedulerTest, OffPoolSequencesNeedNoBlocksAndYieldOnlyToTheirOwnBudget) {
  kv::KvCacheManager kv({.num_layers = 1,
                         .num_kv_heads = 1,
                         .head_dim = 8,
                         .block_size_tokens = 4,
                         .num_blocks = 8,
                         .num_host_blocks = 8},
                        {}, {});
  Scheduler scheduler(
      {.max_num_seqs = 8, .max_num_batched_tokens = 64, .preemption_mode = PreemptionMode::kSwap},
      kv);
  int64_t free_pages = 4;
  std::vector<SeqId> released;
  scheduler.set_off_pool_budget({[&] { return free_pages; }, [](SeqId) { return int64_t{2}; },
                                 [&](SeqId seq) { released.push_back(seq); }});
  TokenId next = 1000;
  auto run = [&] { return run_step(scheduler, kv, next); };
  auto seqs = [](const ScheduledBatch& b) {
    std::vector<uint64_t> out;
    for (const ScheduledChunk& c : b.chunks) out.push_back(c.seq.value);
    return out;
  };
  ASSERT_TRUE(scheduler.add(SeqId{3}, iota_prompt(300, 12), 0, "").ok());
  ASSERT_TRUE(scheduler.add(SeqId{1}, iota_prompt(100, 8), 0, "").ok());
  ASSERT_TRUE(scheduler.add(SeqId{2}, iota_prompt(200, 8), 0, "").ok());
  EXPECT_EQ(seqs(run()), (std::vector<uint64_t>{3, 1, 2}));
  // The executor compressed 1 and 2: their blocks go back and their decodes need none.
  kv.move_off_pool(SeqId{1});
  kv.move_off_pool(SeqId{2});
  EXPECT_EQ(kv.num_available_blocks(), 5);

  // A higher-priority prompt of 5 blocks does not fit beside sequence 3's 4: the victim is 3, the
  // last running sequence holding blocks, not the later off-pool ones (they would free nothing).
  ASSERT_TRUE(scheduler.add(SeqId{5}, iota_prompt(500, 20), -1, "").ok());
  ScheduledBatch second = run();
  EXPECT_EQ(seqs(second), (std::vector<uint64_t>{1, 2, 5}));
  EXPECT_EQ(second.preempted, std::vector<SeqId>{SeqId{3}});
  EXPECT_TRUE(second.preempted_off_pool.empty());
  EXPECT_TRUE(released.empty());
  EXPECT_TRUE(kv.is_swapped(SeqId{3}));
  EXPECT_TRUE(kv.tables(SeqId{1}).empty());
  EXPECT_EQ(kv.num_computed_tokens(SeqId{1}), 9);

  // The off-pool budget covers one decode: the lower-priority off-pool sequence is preempted,
  // and it recomputes (it has no blocks to swap).
  free_pages = 3;
  ScheduledBatch third = run();
  EXPECT_EQ(seqs(third), (std::vector<uint64_t>{5, 1}));
  EXPECT_EQ(third.preempted, std::vector<SeqId>{SeqId{2}});
  EXPECT_EQ(third.preempted_off_pool, std::vector<SeqId>{SeqId{2}});
  EXPECT_EQ(released, std::vector<SeqId>{SeqId{2}});
  EXPECT_FALSE(kv.is_swapped(SeqId{2}));
  EXPECT_FALSE(kv.is_off_pool(SeqId{2}));
  EXPECT_EQ(kv.num_computed_tokens(SeqId{2}), 0);
  EXPECT_EQ(kv.tokens(SeqId{2}).size(), 10u);  // its prompt and the two tokens it sampled

  for (uint64_t s : {1, 2, 3, 5}) scheduler.remove(SeqId{s});
  EXPECT_EQ(kv.num_available_blocks(), 8);
  EXPECT_EQ(kv.num_free_host_blocks(), 8);
}

TEST(SchedulerTest, PrefixHitSkipsCachedPromptTokens) {
  kv::KvCacheManager kv({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8,
                         .block_size_tokens = 4, .num_blocks = 32},
                        {}, {});
  Scheduler scheduler({.max_num_seqs = 8, .max_num_batched_tokens = 64}, kv);
  std::vector<TokenId> prompt(10);
  std::iota(prompt.begin(), prompt.end(), 1);
  ASSERT_TRUE(scheduler.add(SeqId{1}, prompt, 0, "").ok());
  ScheduledBatch first = scheduler.schedule();
  scheduler.on_batch_done(first);
  ASSERT_TRUE(scheduler.add(SeqId{2}, prompt, 0, "").ok());
  // Sequence 1 has nothing to compute (no sampled token was appended), so it sits this out.
  ScheduledBatch second = scheduler.schedule();
  ASSERT_EQ(second.chunks.size(), 1u);
  EXPECT_EQ(second.chunks[0].seq, SeqId{2});
  EXPECT_EQ(second.chunks[0].start_position, 8);
  EXPECT_EQ(second.chunks[0].num_tokens, 2);
  EXPECT_EQ(kv.num_prefix_hit_tokens(SeqId{2}), 8);
}

TEST(SchedulerTest, RejectsPromptLargerThanThePoolAndAbortsRunawaySequences) {
  kv::KvCacheManager kv({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8,
                         .block_size_tokens = 4, .num_blocks = 2},
                        {}, {});
  Scheduler scheduler({.max_num_seqs = 8, .max_num_batched_tokens = 64}, kv);
  Status too_big = scheduler.add(SeqId{1}, std::vector<TokenId>(9, 1), 0, "");
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(scheduler.add(SeqId{2}, std::vector<TokenId>(8, 1), 0, "").ok());
  ScheduledBatch b = scheduler.schedule();
  scheduler.on_batch_done(b);
  kv.append_tokens(SeqId{2}, std::vector<TokenId>{7});
  ScheduledBatch grown = scheduler.schedule();  // 9 tokens need a third block
  EXPECT_TRUE(grown.chunks.empty());
  ASSERT_EQ(grown.aborted.size(), 1u);
  EXPECT_EQ(grown.aborted[0], SeqId{2});
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_EQ(kv.num_available_blocks(), 2);
}

}  // namespace
}  // namespace strata::scheduler
