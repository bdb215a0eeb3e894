// Krul's prompt rows reduced beside decoding (docs/krul.md decision 5; private to the executor):
// the attention observer hands each observed prompt chunk (host copies of its sampled queries and
// of the keys they attend to) to a thread of its own, which turns them into attention rows of
// every layer and adds their statistics up, while the step thread goes on computing passes. This
// is the paper's "prompt rows reduced on CPU threads while decoding continues".
//
// The thread runs at the lowest scheduling priority (nice 19) and on one core (its own OpenMP
// thread count of 1), so on a CPU engine it takes the cycles the step thread leaves idle instead
// of competing with its intra-op threads for the same cores (a team of its own at nice 19
// preempted theirs at barriers and doubled SmolLM2's decode step); on a CUDA engine the host's
// cores are idle while the device computes. Whatever is left when the statistics are needed
// (take) is reduced on the calling thread.
//
// Work is keyed by an id per observed turn (AttentionObserver's), so a turn that is forgotten or
// started over drops its queued chunks and never receives the result of one being reduced.
// Thread-safe; the destructor stops the thread and drops what is queued.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata/kv/krul_policy.h"

namespace strata::executor {

// The observed rows of one prompt chunk: positions first, first + stride, ... < end.
struct PromptRows {
  std::vector<at::Tensor> q;  // per layer [rows, H, D] (host memory)
  int64_t first = 0;
  int64_t stride = 1;
  int64_t end = 0;  // the chunk's positions end here: its rows attend to keys [0, end)
  double scale = 1.0;
  int64_t rows() const { return q.empty() ? 0 : q.front().size(0); }
};

// Adds the statistics of the chunk's rows to `stats`, kRowBlock rows of every layer at a time
// ([layers, H, rows, end] attention rows), over keys [end', Hkv, D] per layer with end' >= end.
void reduce_prompt_rows(const PromptRows& rows, const std::vector<at::Tensor>& keys,
                        kv::krul::AttentionStats& stats);

class PromptReducer {
 public:
  PromptReducer(int32_t num_layers, int32_t num_heads, int32_t num_kv_heads);
  ~PromptReducer();
  PromptReducer(const PromptReducer&) = delete;
  PromptReducer& operator=(const PromptReducer&) = delete;

  // Queues a chunk of turn `turn`, with the turn's keys so far (per layer [end, Hkv, D], host
  // memory): they replace the turn's earlier keys, of which they are an extension, so one copy
  // serves every queued chunk of the turn.
  void submit(uint64_t turn, PromptRows rows, std::vector<at::Tensor> keys);
  // The statistics of every chunk of `turn` submitted so far (zeros if none): waits for the one
  // the thread is reducing, reduces the queued ones here, and forgets the turn.
  kv::krul::AttentionStats take(uint64_t turn);
  // Forgets a turn: its queued chunks are dropped, the result of one being reduced discarded.
  void drop(uint64_t turn);
  // Rows submitted and not reduced yet, over every turn.
  int64_t pending_rows() const;

 private:
  struct Turn {
    std::deque<PromptRows> queued;
    std::vector<at::Tensor> keys;    // the latest submitted: covers every queued chunk
    kv::krul::AttentionStats stats;  // of the chunks reduced so far
    bool running = false;            // the thread is reducing one of its chunks
  };
  void loop();

  const int32_t num_layers_;
  const int32_t num_heads_;
  const int32_t num_kv_heads_;  // of the statistics' token mass (kv::krul::AttentionStats)
  mutable std::mutex mutex_;
  std::condition_variable work_;  // a chunk was queued, or stop
  std::condition_variable done_;  // the thread finished a chunk
  std::unordered_map<uint64_t, Turn> turns_;
  std::deque<uint64_t> order_;  // a turn per queued chunk, in submission order
  int64_t pending_rows_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace strata::executor
