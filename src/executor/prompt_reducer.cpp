#include "prompt_reducer.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "strata/kernels/krul_ops.h"

namespace strata::executor {
namespace {

constexpr int64_t kRowBlock = 16;  // prompt rows turned into attention rows at once

}  // namespace

void reduce_prompt_rows(const PromptRows& rows, const std::vector<at::Tensor>& keys,
                        kv::krul::AttentionStats& stats) {
  const int64_t n = rows.rows();
  for (int64_t done = 0; done < n; done += kRowBlock) {
    const int64_t take = std::min(kRowBlock, n - done);
    const int64_t first = rows.first + done * rows.stride;
    // The block's rows see keys [0, seen) only (causal): the keys after its last row would add
    // zero columns to every product below.
    const int64_t seen = first + (take - 1) * rows.stride + 1;
    std::vector<at::Tensor> layer_rows;
    layer_rows.reserve(rows.q.size());
    for (size_t l = 0; l < rows.q.size(); ++l) {
      // rows first, first + stride, ... over the keys they see, zero beyond each row's position
      layer_rows.push_back(kernels::aten::krul_attention_rows(rows.q[l].narrow(0, done, take),
                                                              keys[l].narrow(0, 0, seen), first,
                                                              rows.scale, rows.stride));
    }
    const at::Tensor lengths =
        at::arange(first + 1, first + 1 + take * rows.stride, rows.stride, at::kLong);
    kernels::aten::krul_accumulate(at::stack(layer_rows), lengths, stats);
  }
}

PromptReducer::PromptReducer(int32_t num_layers, int32_t num_heads, int32_t num_kv_heads)
    : num_layers_(num_layers),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      thread_([this] { loop(); }) {}

PromptReducer::~PromptReducer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

void PromptReducer::submit(uint64_t turn, PromptRows rows, std::vector<at::Tensor> keys) {
  {
    std::lock_guard lock(mutex_);
    auto [it, added] = turns_.try_emplace(turn);
    if (added) it->second.stats = kv::krul::AttentionStats(num_layers_, num_heads_, num_kv_heads_);
    pending_rows_ += rows.rows();
    it->second.queued.push_back(std::move(rows));
    it->second.keys = std::move(keys);
    order_.push_back(turn);
  }
  work_.notify_one();
}

kv::krul::AttentionStats PromptReducer::take(uint64_t turn) {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] {
    auto it = turns_.find(turn);
    return it == turns_.end() || !it->second.running;
  });
  auto it = turns_.find(turn);
  if (it == turns_.end()) return kv::krul::AttentionStats(num_layers_, num_heads_, num_kv_heads_);
  Turn left = std::move(it->second);
  turns_.erase(it);
  for (const PromptRows& rows : left.queued) pending_rows_ -= rows.rows();
  lock.unlock();
  for (const PromptRows& rows : left.queued) reduce_prompt_rows(rows, left.keys, left.stats);
  return std::move(left.stats);
}

void PromptReducer::drop(uint64_t turn) {
  std::lock_guard lock(mutex_);
  auto it = turns_.find(turn);
  if (it == turns_.end()) return;
  for (const PromptRows& rows : it->second.queued) pending_rows_ -= rows.rows();
  turns_.erase(it);
}

int64_t PromptReducer::pending_rows() const {
  std::lock_guard lock(mutex_);
  return pending_rows_;
}

void PromptReducer::loop() {
  // The lowest priority for this thread (Linux's nice is per thread), and its ops run on it alone:
  // a team of intra-op threads of its own, preempting the step thread's team at barriers,
  // doubled SmolLM2's decode step (measured).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  omp_set_num_threads(1);  // this thread's OpenMP count only (libtorch's runtime)
  c10::InferenceMode inference_mode;
  std::unique_lock lock(mutex_);
  while (true) {
    work_.wait(lock, [&] { return stopping_ || !order_.empty(); });
    if (stopping_) return;
    const uint64_t turn = order_.front();
    order_.pop_front();
    auto it = turns_.find(turn);
    if (it == turns_.end() || it->second.queued.empty()) continue;  // dropped or taken
    PromptRows rows = std::move(it->second.queued.front());
    it->second.queued.pop_front();
    const std::vector<at::Tensor> keys = it->second.keys;
    it->second.running = true;
    lock.unlock();
    kv::krul::AttentionStats stats(num_layers_, num_heads_, num_kv_heads_);
    bool reduced = true;
    try {
      reduce_prompt_rows(rows, keys, stats);
    } catch (const std::exception&) {
      reduced = false;  // left to take(), on whose thread the error surfaces
    }
    lock.lock();
    it = turns_.find(turn);
    if (it != turns_.end()) {  // not dropped meanwhile (take waits for it)
      it->second.running = false;
      if (reduced) {
        it->second.stats.add(stats);
      } else {
        it->second.queued.push_front(std::move(rows));
      }
    }
    if (reduced || it == turns_.end()) pending_rows_ -= rows.rows();
    done_.notify_all();
  }
}

}  // namespace strata::executor
