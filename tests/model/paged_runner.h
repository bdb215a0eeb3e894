// Test helper: drives an Executor the way the engine does (KV manager plans, page tables in the
// batch), so executor tests can feed token chunks per sequence without the scheduler.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "strata/executor/executor.h"
#include "strata/kv/kv_cache_manager.h"

namespace strata::executor::testing {

class PagedRunner {
 public:
  explicit PagedRunner(Executor& executor)
      : executor_(executor),
        kv_(executor.kv_geometry(), executor.kv_format(), kv::PrefixCacheOptions{false, 0}) {}

  struct Step {
    SeqId seq;
    std::vector<TokenId> tokens;
    LogitsMode logits = LogitsMode::kLast;
    kv::KvLayout layout = {};  // used when the step creates its sequence
    bool samples = true;       // the chunk ends at the sequence's last token (SequenceChunk)
    bool observe_attention = false;  // Krul's statistics (SequenceChunk)
    int32_t observe_row_stride = 1;
  };

  // Appends each step's tokens to its sequence (creating it on first use) and runs them in one
  // forward pass. Fails the test (and returns an empty result) if planning or the pass fails.
  StatusOr<ForwardResult> run(const std::vector<Step>& steps) {
    std::vector<kv::KvRequest> requests;
    for (const Step& s : steps) {
      if (!kv_.has_sequence(s.seq)) {
        Status added = kv_.add_sequence(s.seq, s.tokens, "", true, s.layout);
        if (!added.ok()) return added;
      } else {
        kv_.append_tokens(s.seq, s.tokens);
      }
      requests.push_back({s.seq, static_cast<int64_t>(s.tokens.size())});
    }
    StatusOr<kv::KvPlan> plan = kv_.prepare(requests);
    if (!plan.ok()) return plan.status();
    ForwardBatch batch;
    kv_.commit(std::move(plan).value(), &batch.copies);
    for (const Step& s : steps) {
      const int64_t start = kv_.num_computed_tokens(s.seq);
      batch.chunks.push_back(
          {s.seq, s.tokens, start, kv_.tables(s.seq), s.logits, &kv_.layout(s.seq), s.samples});
      batch.chunks.back().observe_attention = s.observe_attention;
      batch.chunks.back().observe_row_stride = s.observe_row_stride;
    }
    StatusOr<ForwardResult> result = executor_.forward(batch);
    if (result.ok()) {
      for (const Step& s : steps) {
        kv_.mark_computed(s.seq, static_cast<int64_t>(s.tokens.size()));
      }
    }
    return result;
  }

  kv::KvCacheManager& kv() { return kv_; }

 private:
  Executor& executor_;
  kv::KvCacheManager kv_;
};

}  // namespace strata::executor::testing
