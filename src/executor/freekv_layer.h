// FreeKV's speculative retrieval for one sequence and one layer (private to the executor;
// docs/freekv.md, the paper's digest ../shared/papers/freekv.md).
//
// Where the KV lives (n_kv KV heads, head_dim d, pages of p tokens):
//   resident  the first S tokens (sinks) and the last W..W+p-1 tokens (window), token-major
//             [t, n_kv, d]: every step attends them.
//   host      every page that left the window, head-major [n_page, n_kv, 2, p, d] (keys and
//             values of one page and head contiguous; pinned host memory on CUDA), with its
//             min/max key summary [n_page, n_kv, d] (on the device).
//   cache     two buffers of (B - S - W) / p slots, token-major [slots, p, n_kv, d] like the KV
//             pool the attention kernel reads; slot i of head m holds the page recalled for m.
//             No slot when B = S + W: StreamingLLM (sink + window only), the static baseline.
// Resident tokens and cache buffers live on the layer's device. Selection, the layout
// conversions and attention are kernels::freekv_* (CUDA kernels or libtorch, as the start-up
// self-check chose; on the CPU the recall is a memcpy loop). On CUDA a recall copies each
// (page, head) block up into a staging buffer and converts it on the device, on a copy stream
// that waits for the step's compute (an event) and that the next step's compute waits for.
// A decode step (decode()):
//   1. waits for the recall the previous step started into the back buffer; it becomes the front.
//   2. the query's cosine to the previous step's, averaged over each KV head's query heads; heads
//      below tau (all of them at the first step) are corrected: selection with this query (all
//      heads, one call) and their recall into the front buffer, synchronously.
//   3. attention over resident + front (the others read the pages selected one step earlier).
//   4. a window grown to W + p tokens offloads its oldest page (head-major copy, summary).
//   5. for the next step: selection with this query (reusing step 2's when nothing was
//      offloaded; on CUDA on the recall thread) and, on the recall thread, the recall of every
//      head's pages into the back buffer: pages the front already holds are copied from it
//      (delta recall), the rest from the host pages.
//      Not when tau > 1: every head corrects at every step (synchronous retrieval).
// The recall (on a RecallWorker's thread, shared by every layer of a runtime) only writes the
// back buffer, which no attention reads until the next step has waited for it; offloads, the
// only writes to the host pages, happen between the wait and the next recall.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "strata/common/status.h"
#include "strata/executor/executor.h"
#include "strata/kernels/kernel_selection.h"

namespace strata::executor {

// INVALID_ARGUMENT unless p >= 1, S and W are multiples of p, B >= S + W, and tau is a number.
// B = S + W selects no page: StreamingLLM (sink + window), FreeKV's static baseline. (The layer
// reads neither `enabled` nor `min_context_tokens`: they are the executor's.)
Status validate(const FreeKvConfig& config);

// One thread that runs posted jobs in order: FreeKV's recalls of every layer and sequence of a
// runtime (the paper's single controller; a layer waits only for its own job).
class RecallWorker {
 public:
  RecallWorker();
  ~RecallWorker();  // runs what is posted, then joins
  RecallWorker(const RecallWorker&) = delete;
  RecallWorker& operator=(const RecallWorker&) = delete;

  // Queues `job`; *pending is true until it has run (guarded by the worker).
  void post(std::function<void()> job, bool* pending);
  void wait(const bool* pending);  // until that job has run

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::function<void()>, bool*>> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is initialised
};

// Where a FreeKV layer runs: its device (CPU, or a CUDA device with pinned host pages) and the
// implementation of each FreeKV op (the executor's start-up self-check, kernels/self_check.h).
struct FreeKvDevice {
  at::Device device = at::kCPU;
  kernels::KernelBackend select = kernels::KernelBackend::kStrata;
  kernels::KernelBackend pages = kernels::KernelBackend::kStrata;
  kernels::KernelBackend attention = kernels::KernelBackend::kStrata;
};

// to += from, field by field (sequences excepted: a count of the runtime's).
void add_counts(FreeKvCounts& to, const FreeKvCounts& from);

class FreeKvLayer {
 public:
  // `worker` runs this layer's recalls and outlives it.
  FreeKvLayer(const FreeKvConfig& options, int64_t num_kv_heads, int64_t head_dim,
              at::ScalarType dtype, RecallWorker& worker, const FreeKvDevice& device = {});
  ~FreeKvLayer();  // waits for the recall in flight
  FreeKvLayer(const FreeKvLayer&) = delete;
  FreeKvLayer& operator=(const FreeKvLayer&) = delete;

  // Keys (after RoPE) and values [n, n_kv, d] of the prompt, before the first decode step (any
  // device and dtype: copied to the layer's).
  void prefill(const at::Tensor& k, const at::Tensor& v);
  // One decode token: appends k, v [n_kv, d] and returns the attention of q [n_q, d] (after
  // RoPE; n_q a multiple of n_kv) over the token's context, [n_q, d] in q's dtype.
  at::Tensor decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

  int64_t tokens() const { return tokens_; }
  // The steps so far; a recall still in flight counts its pages when it is done.
  FreeKvCounts stats() const;
  // Tests: fills the back buffer with NaN before each step's attention (a step that read it
  // would return NaN).
  void poison_back_buffer_for_testing() { poison_ = true; }
  // Tests: every recall on the recall thread throws (as a failed copy or allocation would).
  void fail_recalls_for_testing() { fail_recalls_ = true; }

 private:
  struct Buffer {
    at::Tensor k, v;                          // [slots, p, n_kv, d]
    std::vector<std::vector<int64_t>> pages;  // per KV head: the page in each slot
  };
  struct Cuda;  // streams, events and staging buffers of a CUDA layer (freekv_layer.cpp)

  void append(const at::Tensor& k, const at::Tensor& v);  // [n, n_kv, d]
  void offload_page();                                    // the window's oldest page
  // The pages of each KV head for query q: int64 [n_kv, s] as a list per head.
  std::vector<std::vector<int64_t>> select(const at::Tensor& q, double scale) const;
  // Copies the selected pages of `heads` into `into`, from `from` where it holds them, on the
  // current stream (CUDA). Runs on either thread.
  void recall(const std::vector<std::vector<int64_t>>& selected, const std::vector<bool>& heads,
              Buffer& into, const Buffer& from);
  // Posts the selection (unless `selected` holds it) and the recall for the next step.
  void start_recall(std::vector<std::vector<int64_t>> selected, const at::Tensor& q, double scale);
  // Until this layer's recall has run (and, on CUDA, the compute stream waits for its copies);
  // rethrows the recall's exception, if it threw.
  void wait_recall();
  at::TensorOptions host_options() const;  // the host pages' (pinned on CUDA)
  // wait_recall() for a recall posted by this thread, its time counted as exposed.
  void wait_recall_timed();
  at::Tensor resident(const at::Tensor& rows) const {
    return rows.narrow(0, 0, sink_len_ + window_len_);
  }

  const FreeKvConfig options_;
  const int64_t num_kv_heads_, head_dim_, slots_;
  const at::ScalarType dtype_;
  const FreeKvDevice device_;
  std::unique_ptr<Cuda> cuda_;  // CUDA only
  int64_t tokens_ = 0;

  // The resident tokens, [S + W + p, n_kv, d]: the sink in rows [0, sink_len_), the window in
  // rows [S, S + window_len_) (filled only once the sink is), so rows [0, sink_len_ +
  // window_len_) are every resident token, in order.
  at::Tensor resident_k_, resident_v_;
  int64_t sink_len_ = 0, window_len_ = 0;
  at::Tensor host_;         // [capacity, n_kv, 2, p, d]
  at::Tensor kmin_, kmax_;  // [capacity, n_kv, d]
  int64_t num_pages_ = 0;

  std::array<Buffer, 2> buffers_;
  int front_ = 0;
  at::Tensor q_prev_;   // [n_q, d], undefined before the first step
  FreeKvCounts stats_;  // steps, head steps and corrections (the step thread's)
  std::atomic<int64_t> recalled_pages_{0}, reused_pages_{0};  // counted by either thread
  std::atomic<int64_t> recall_ns_{0};                         // either thread
  int64_t exposed_ns_ = 0;                                    // the step thread's recalls and waits
  bool poison_ = false;
  bool fail_recalls_ = false;

  RecallWorker& worker_;
  bool recall_pending_ = false;      // this layer's recall is posted and has not run (the worker's)
  bool recall_posted_ = false;       // the step thread's: a recall was posted and not waited for
  std::exception_ptr recall_error_;  // a failed recall's, rethrown by the next wait (the worker's)
};

}  // namespace strata::executor
