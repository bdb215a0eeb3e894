// How a model is split across tensor-parallel ranks (src/executor/tensor_shard.h): exact splits
// of the default model and of uneven head counts, and the split's invariants over a grid.

#include "tensor_shard.h"

#include <gtest/gtest.h>

#include <tuple>

namespace strata::executor {
namespace {

model::ModelConfig config(int64_t heads, int64_t kv_heads, int64_t ffn = 1536,
                          int64_t vocab = 49152) {
  model::ModelConfig c;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.intermediate_size = ffn;
  c.vocab_size = vocab;
  return c;
}

std::vector<TensorShard> plan_all(const model::ModelConfig& c, int32_t world) {
  std::vector<TensorShard> shards;
  for (int32_t r = 0; r < world; ++r) {
    StatusOr<TensorShard> s = TensorShard::plan(c, r, world);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (s.ok()) shards.push_back(*s);
  }
  return shards;
}

TEST(TensorShard, DefaultModelAtTwoAndFourRanks) {
  // SmolLM2-135M: 9 query heads, 3 KV heads (groups of 3), 1536 intermediate, 49152 tokens.
  const model::ModelConfig c = config(9, 3);
  std::vector<TensorShard> two = plan_all(c, 2);
  EXPECT_EQ(two[0].kv_heads, (IndexRange{0, 1}));
  EXPECT_EQ(two[0].q_heads, (IndexRange{0, 3}));
  EXPECT_EQ(two[1].kv_heads, (IndexRange{1, 3}));
  EXPECT_EQ(two[1].q_heads, (IndexRange{3, 9}));
  EXPECT_EQ(two[1].max_kv_heads, 2);
  EXPECT_EQ(two[0].ffn, (IndexRange{0, 768}));
  EXPECT_EQ(two[1].vocab, (IndexRange{24576, 49152}));
  // Four ranks, three KV heads: KV head 0 is replicated on ranks 0 and 1, which split its group.
  std::vector<TensorShard> four = plan_all(c, 4);
  const IndexRange kv[] = {{0, 1}, {0, 1}, {1, 2}, {2, 3}};
  const IndexRange q[] = {{0, 1}, {1, 3}, {3, 6}, {6, 9}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(four[r].kv_heads, kv[r]) << r;
    EXPECT_EQ(four[r].q_heads, q[r]) << r;
  }
  EXPECT_EQ(four[0].owner_of_kv_head(0), 0);
  EXPECT_EQ(four[0].owner_of_kv_head(1), 2);
}

TEST(TensorShard, UnevenFfnAndVocabulary) {
  // 160 intermediate units = 5 runs of 32; 322 tokens.
  std::vector<TensorShard> s = plan_all(config(6, 3, 160, 322), 4);
  EXPECT_EQ(s[0].ffn, (IndexRange{0, 32}));
  EXPECT_EQ(s[3].ffn, (IndexRange{96, 160}));
  EXPECT_EQ(s[0].vocab, (IndexRange{0, 80}));
  EXPECT_EQ(s[1].vocab, (IndexRange{80, 161}));
  EXPECT_EQ(s[0].max_vocab, 81);
  // Not a multiple of 32: runs of single units.
  std::vector<TensorShard> odd = plan_all(config(4, 2, 100, 10), 3);
  EXPECT_EQ(odd[0].ffn, (IndexRange{0, 33}));
  EXPECT_EQ(odd[2].ffn, (IndexRange{66, 100}));
}

TEST(TensorShard, RefusesMoreRanksThanHeads) {
  StatusOr<TensorShard> s = TensorShard::plan(config(4, 2), 0, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("exceeds the model's 4 attention heads"), std::string::npos);
  EXPECT_FALSE(TensorShard::plan(config(4, 2), 2, 2).ok());
}

// Over a grid of head counts and ranks: query heads and the vocabulary are partitioned in rank
// order, every KV head has an owner, and each rank's query heads read its own KV heads in the
// uniform groups the attention kernels assume (local query head i reads local KV head
// i / (queries / kv heads)).
TEST(TensorShard, InvariantsOverAGrid) {
  for (int64_t kv_heads : {1, 2, 3, 4, 8}) {
    for (int64_t group : {1, 2, 3, 4, 7}) {
      const int64_t heads = kv_heads * group;
      for (int32_t world = 1; world <= std::min<int64_t>(heads, 8); ++world) {
        const model::ModelConfig c = config(heads, kv_heads, 4096, 1001);
        std::vector<TensorShard> shards;
        bool refused = false;
        for (int32_t r = 0; r < world && !refused; ++r) {
          StatusOr<TensorShard> s = TensorShard::plan(c, r, world);
          refused = !s.ok();
          if (s.ok()) shards.push_back(*s);
        }
        const std::string where = std::to_string(heads) + "/" + std::to_string(kv_heads) +
                                  " heads at " + std::to_string(world) + " ranks";
        if (refused) continue;  // more ranks on one KV head than its group has query heads
        int64_t next_q = 0, next_vocab = 0;
        for (const TensorShard& s : shards) {
          EXPECT_EQ(s.q_heads.begin, next_q) << where;
          EXPECT_GT(s.q_heads.size(), 0) << where;
          next_q = s.q_heads.end;
          EXPECT_EQ(s.vocab.begin, next_vocab) << where;
          next_vocab = s.vocab.end;
          ASSERT_GT(s.kv_heads.size(), 0) << where;
          ASSERT_EQ(s.q_heads.size() % s.kv_heads.size(), 0) << where;
          const int64_t local_group = s.q_heads.size() / s.kv_heads.size();
          for (int64_t i = 0; i < s.q_heads.size(); ++i) {
            EXPECT_EQ((s.q_heads.begin + i) / group - s.kv_heads.begin, i / local_group) << where;
          }
          EXPECT_EQ(s.ffn.begin % 32, 0) << where;
        }
        EXPECT_EQ(next_q, heads) << where;
        EXPECT_EQ(next_vocab, 1001) << where;
        for (int64_t h = 0; h < kv_heads; ++h) EXPECT_GE(shards[0].owner_of_kv_head(h), 0) << where;
      }
    }
  }
}

}  // namespace
}  // namespace strata::executor
