#include "freekv_layer.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "strata/kernels/freekv_ops.h"
#include "strata/kernels/torch_ops.h"

namespace strata::executor {

namespace ka = kernels::aten;

namespace {

int64_t nanoseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

}  // namespace

Status validate(const FreeKvConfig& o) {
  const int64_t p = o.page_tokens;
  if (p < 1) return invalid_argument_error("freekv: page_tokens must be positive");
  if (o.sink_tokens < 0 || o.sink_tokens % p != 0 || o.window_tokens < 0 ||
      o.window_tokens % p != 0) {
    return invalid_argument_error("freekv: sink_tokens (" + std::to_string(o.sink_tokens) +
                                  ") and window_tokens (" + std::to_string(o.window_tokens) +
                                  ") must be multiples of page_tokens (" + std::to_string(p) + ")");
  }
  if (std::isnan(o.tau)) return invalid_argument_error("freekv: tau must be a number");
  if (o.budget_tokens < o.sink_tokens + o.window_tokens) {
    return invalid_argument_error("freekv: budget_tokens (" + std::to_string(o.budget_tokens) +
                                  ") is less than sink_tokens + window_tokens");
  }
  if (o.method == FreeKvMethod::kH2o && o.window_tokens < 1) {
    return invalid_argument_error("freekv: method h2o needs window_tokens >= 1");
  }
  if (o.method == FreeKvMethod::kH2o && o.budget_tokens <= o.window_tokens) {
    return invalid_argument_error("freekv: method h2o needs budget_tokens (" +
                                  std::to_string(o.budget_tokens) + ") above window_tokens");
  }
  return Status();
}

RecallWorker::RecallWorker() : thread_([this] { run(); }) {}

RecallWorker::~RecallWorker() {
  {
    std::scoped_lock lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void RecallWorker::post(std::function<void()> job, bool* pending) {
  {
    std::scoped_lock lock(mutex_);
    *pending = true;
    jobs_.emplace_back(std::move(job), pending);
  }
  changed_.notify_all();
}

void RecallWorker::wait(const bool* pending) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !*pending; });
}

void RecallWorker::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, with nothing left to run
    auto [job, pending] = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
    *pending = false;
    changed_.notify_all();
  }
}

// A CUDA layer's recall machinery: the copy stream recalls run on, an event the step's compute
// records before a recall is posted (the recall waits for it: the back buffer's last reader and
// the offloads' device-to-host copies come before it) and one the recall records when its copies
// and conversion are enqueued (the next step's compute waits for it), and the device staging
// buffers of the transfers.
struct FreeKvLayer::Cuda {
  c10::cuda::CUDAStream copy;
  at::cuda::CUDAEvent compute_ready, recall_done;
  at::Tensor staging;       // [n_kv * slots, 2, p, d]: (page, head) blocks copied up
  at::Tensor page_staging;  // [n_kv, 2, p, d]: an offloaded page on its way down

  c10::cuda::CUDAStream compute() const {
    return c10::cuda::getCurrentCUDAStream(copy.device_index());
  }
};

FreeKvLayer::FreeKvLayer(const FreeKvConfig& options, int64_t num_kv_heads, int64_t head_dim,
                         at::ScalarType dtype, RecallWorker& worker, const FreeKvDevice& device)
    : options_(options),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      slots_((options.budget_tokens - options.sink_tokens - options.window_tokens) /
             options.page_tokens),
      dtype_(dtype),
      device_(device),
      worker_(worker) {
  const int64_t p = options_.page_tokens;
  const auto opts = at::TensorOptions().dtype(dtype_).device(device_.device);
  resident_k_ = at::empty(
      {options_.sink_tokens + options_.window_tokens + p, num_kv_heads_, head_dim_}, opts);
  resident_v_ = at::empty_like(resident_k_);
  host_ = at::empty({0, num_kv_heads_, 2, p, head_dim_}, host_options());
  kmin_ = at::empty({0, num_kv_heads_, head_dim_}, opts);
  kmax_ = at::empty_like(kmin_);
  for (Buffer& b : buffers_) {
    b.k = at::zeros({slots_, p, num_kv_heads_, head_dim_}, opts);
    b.v = at::zeros_like(b.k);
    b.pages.assign(num_kv_heads_, {});
  }
  if (device_.device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device_.device);
    cuda_ = std::unique_ptr<Cuda>(
        new Cuda{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.device.index()),
                 at::cuda::CUDAEvent(), at::cuda::CUDAEvent(),
                 at::empty({num_kv_heads_ * slots_, 2, p, head_dim_}, opts),
                 at::empty({num_kv_heads_, 2, p, head_dim_}, opts)});
  }
}

FreeKvLayer::~FreeKvLayer() {
  worker_.wait(&recall_pending_);               // its error, if any, has nobody to go to
  if (cuda_) cuda_->recall_done.synchronize();  // the copies still write this layer's buffers
}

at::TensorOptions FreeKvLayer::host_options() const {
  return at::TensorOptions().dtype(dtype_).pinned_memory(device_.device.is_cuda());
}

void FreeKvLayer::start_recall(std::vector<std::vector<int64_t>> selected, const at::Tensor& q,
                               double scale) {
  Buffer& back = buffers_[1 - front_];
  const Buffer& front = buffers_[front_];
  if (cuda_) cuda_->compute_ready.record(cuda_->compute());
  recall_posted_ = true;
  worker_.post(
      [this, selected = std::move(selected), q, scale, &back, &front]() mutable {
        const auto start = std::chrono::steady_clock::now();
        const std::vector<bool> all(num_kv_heads_, true);
        try {  // an error is the next step's, on the step thread (wait_recall)
          if (fail_recalls_) throw std::runtime_error("recall failed (injected)");
          if (cuda_) {
            const c10::cuda::CUDAStreamGuard guard(cuda_->copy);
            cuda_->compute_ready.block(cuda_->copy);
            if (selected.empty()) selected = select(q, scale);
            recall(selected, all, back, front);
            cuda_->recall_done.record(cuda_->copy);
          } else {
            if (selected.empty()) selected = select(q, scale);
            recall(selected, all, back, front);
          }
        } catch (...) {
          recall_error_ = std::current_exception();
        }
        recall_ns_ += nanoseconds_since(start);
      },
      &recall_pending_);
}

void FreeKvLayer::wait_recall() {
  worker_.wait(&recall_pending_);
  if (cuda_) cuda_->recall_done.block(cuda_->compute());
  if (recall_error_) std::rethrow_exception(std::exchange(recall_error_, nullptr));
}

void FreeKvLayer::append(const at::Tensor& k, const at::Tensor& v) {
  const int64_t n = k.size(0);
  int64_t i = 0;
  if (sink_len_ < options_.sink_tokens) {
    const int64_t take = std::min(n, options_.sink_tokens - sink_len_);
    resident_k_.narrow(0, sink_len_, take).copy_(k.narrow(0, 0, take));
    resident_v_.narrow(0, sink_len_, take).copy_(v.narrow(0, 0, take));
    sink_len_ += take;
    i = take;
  }
  const int64_t start = options_.sink_tokens;
  const int64_t capacity = options_.window_tokens + options_.page_tokens;
  while (i < n) {
    if (window_len_ == capacity) offload_page();
    const int64_t take = std::min(n - i, capacity - window_len_);
    resident_k_.narrow(0, start + window_len_, take).copy_(k.narrow(0, i, take));
    resident_v_.narrow(0, start + window_len_, take).copy_(v.narrow(0, i, take));
    window_len_ += take;
    i += take;
  }
  tokens_ += n;
}

void FreeKvLayer::offload_page() {
  const int64_t p = options_.page_tokens;
  if (num_pages_ == host_.size(0)) {  // grow the host pages and summaries geometrically
    // The device-to-host copies of earlier offloads land in the old pages first.
    if (cuda_) cuda_->compute().synchronize();
    const int64_t capacity = std::max<int64_t>(16, 2 * num_pages_);
    at::Tensor host = at::empty({capacity, num_kv_heads_, 2, p, head_dim_}, host_options());
    host.narrow(0, 0, num_pages_).copy_(host_.narrow(0, 0, num_pages_));
    at::Tensor kmin = at::empty({capacity, num_kv_heads_, head_dim_}, kmin_.options());
    at::Tensor kmax = at::empty_like(kmin);
    kmin.narrow(0, 0, num_pages_).copy_(kmin_.narrow(0, 0, num_pages_));
    kmax.narrow(0, 0, num_pages_).copy_(kmax_.narrow(0, 0, num_pages_));
    host_ = std::move(host);
    kmin_ = std::move(kmin);
    kmax_ = std::move(kmax);
  }
  // Token-major [p, n_kv, d] -> head-major [n_kv, 2, p, d], with the page's summary (on the
  // device); on CUDA converted in a staging page, then copied down in one transfer.
  at::Tensor lo = kmin_.select(0, num_pages_), hi = kmax_.select(0, num_pages_);
  const int64_t start = options_.sink_tokens;
  const at::Tensor rows_k = resident_k_.narrow(0, start, p),
                   rows_v = resident_v_.narrow(0, start, p);
  if (cuda_) {
    kernels::freekv_offload(rows_k, rows_v, cuda_->page_staging, lo, hi, device_.pages);
    host_.select(0, num_pages_).copy_(cuda_->page_staging, /*non_blocking=*/true);
  } else {
    at::Tensor page = host_.select(0, num_pages_);
    kernels::freekv_offload(rows_k, rows_v, page, lo, hi, device_.pages);
  }
  ++num_pages_;
  const int64_t rest = window_len_ - p;
  if (rest > 0) {
    resident_k_.narrow(0, start, rest).copy_(resident_k_.narrow(0, start + p, rest).clone());
    resident_v_.narrow(0, start, rest).copy_(resident_v_.narrow(0, start + p, rest).clone());
  }
  window_len_ = rest;
}

std::vector<std::vector<int64_t>> FreeKvLayer::select(const at::Tensor& q, double scale) const {
  const at::Tensor s =
      kernels::freekv_select(q.contiguous(), kmin_.narrow(0, 0, num_pages_),
                             kmax_.narrow(0, 0, num_pages_), slots_, scale, device_.select)
          .cpu()
          .contiguous();
  std::vector<std::vector<int64_t>> lists(num_kv_heads_);
  for (int64_t m = 0; m < num_kv_heads_; ++m) {
    const int64_t* row = s[m].data_ptr<int64_t>();
    lists[m].assign(row, row + s.size(1));
  }
  return lists;
}

void FreeKvLayer::recall(const std::vector<std::vector<int64_t>>& selected,
                         const std::vector<bool>& heads, Buffer& into, const Buffer& from) {
  // Items {head, slot, source}: the source a (page, head) block of the host pages (page * n_kv +
  // head; on CUDA the staging row it is copied up to) or -(the slot of `from` holding it) - 1.
  std::vector<int32_t> items;
  std::vector<int64_t> staged;  // CUDA: the host block of each staging row
  for (int64_t m = 0; m < num_kv_heads_; ++m) {
    if (!heads[m]) continue;
    const std::vector<int64_t>& pages = selected[m];
    for (size_t i = 0; i < pages.size(); ++i) {
      int64_t held = -1;  // the slot of `from` that holds the page (none when recalling in place)
      for (size_t s = 0; s < from.pages[m].size() && &from != &into; ++s) {
        if (from.pages[m][s] == pages[i]) held = static_cast<int64_t>(s);
      }
      int64_t source = -held - 1;
      if (held < 0) {
        const int64_t block = pages[i] * num_kv_heads_ + m;
        source = cuda_ ? std::ssize(staged) : block;
        if (cuda_) staged.push_back(block);
      }
      items.insert(items.end(), {static_cast<int32_t>(m), static_cast<int32_t>(i),
                                 static_cast<int32_t>(source)});
      ++(held >= 0 ? reused_pages_ : recalled_pages_);
    }
    into.pages[m] = pages;
  }
  if (items.empty()) return;
  const int64_t p = options_.page_tokens;
  const at::Tensor blocks = host_.view({-1, 2, p, head_dim_});  // [n_page * n_kv, 2, p, d]
  const at::Tensor table = at::from_blob(items.data(), {std::ssize(items) / 3, 3}, at::kInt);
  if (!cuda_) {
    kernels::freekv_recall(blocks, table, into.k, into.v, from.k, from.v, device_.pages);
    return;
  }
  // Each (page, head) block up in one transfer (pinned memory), then converted on the device.
  const at::Tensor chunks = cuda_->staging.narrow(0, 0, std::ssize(staged));
  for (size_t j = 0; j < staged.size(); ++j) {
    chunks[static_cast<int64_t>(j)].copy_(blocks[staged[j]], /*non_blocking=*/true);
  }
  // The items through pinned memory too: a pageable copy would wait for the copy stream.
  const at::Tensor items_up =
      table.pin_memory().to(device_.device, at::kInt, /*non_blocking=*/true);
  kernels::freekv_recall(chunks, items_up, into.k, into.v, from.k, from.v, device_.pages);
}

void FreeKvLayer::wait_recall_timed() {
  if (!recall_posted_) return;
  const auto start = std::chrono::steady_clock::now();
  wait_recall();
  exposed_ns_ += nanoseconds_since(start);
  recall_posted_ = false;
}

void add_counts(FreeKvCounts& to, const FreeKvCounts& from) {
  to.steps += from.steps;
  to.head_steps += from.head_steps;
  to.corrected_heads += from.corrected_heads;
  to.recalled_pages += from.recalled_pages;
  to.reused_pages += from.reused_pages;
  to.recall_seconds += from.recall_seconds;
  to.recall_exposed_seconds += from.recall_exposed_seconds;
}

FreeKvCounts FreeKvLayer::stats() const {
  FreeKvCounts counts = stats_;
  counts.recalled_pages = recalled_pages_.load();
  counts.reused_pages = reused_pages_.load();
  counts.recall_seconds = static_cast<double>(recall_ns_.load()) * 1e-9;
  counts.recall_exposed_seconds = static_cast<double>(exposed_ns_) * 1e-9;
  return counts;
}

void FreeKvLayer::prefill(const at::Tensor& k, const at::Tensor& v) {
  wait_recall_timed();
  append(k.to(device_.device, dtype_), v.to(device_.device, dtype_));
}

at::Tensor FreeKvLayer::decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale) {
  wait_recall_timed();
  front_ = 1 - front_;  // what the previous step recalled
  Buffer& front = buffers_[front_];
  append(k.to(dtype_).unsqueeze(0), v.to(dtype_).unsqueeze(0));  // on the layer's device

  // Which KV heads read pages selected with this query: all at the first step (no previous
  // query), else those whose query moved (similarity below tau).
  std::vector<bool> corrected(num_kv_heads_, true);
  if (q_prev_.defined()) {
    const at::Tensor similarity =
        ka::freekv_query_similarity(q, q_prev_, num_kv_heads_).to(at::kCPU, at::kDouble);
    for (int64_t m = 0; m < num_kv_heads_; ++m) {
      corrected[m] = similarity[m].item<double>() < options_.tau;
    }
  }
  int64_t num_corrected = 0;
  for (bool c : corrected) num_corrected += c ? 1 : 0;
  std::vector<std::vector<int64_t>> selected;
  const bool retrieves = slots_ > 0 && num_pages_ > 0;  // else StreamingLLM: sink + window
  if (num_corrected > 0 && retrieves) {
    const auto start = std::chrono::steady_clock::now();
    selected = select(q, scale);
    recall(selected, corrected, front, front);
    const int64_t took = nanoseconds_since(start);  // selection and recall: on the critical path
    recall_ns_ += took;
    exposed_ns_ += took;
  } else if (!retrieves) {
    for (std::vector<int64_t>& pages : front.pages) pages.clear();
  }

  if (poison_) {
    Buffer& back = buffers_[1 - front_];
    back.k.fill_(std::numeric_limits<double>::quiet_NaN());
    back.v.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  std::vector<int64_t> counts;
  for (const std::vector<int64_t>& pages : front.pages) counts.push_back(std::ssize(pages));
  at::Tensor slots = at::tensor(counts, at::kLong);
  if (cuda_) slots = slots.pin_memory().to(device_.device, at::kLong, /*non_blocking=*/true);
  at::Tensor out =
      kernels::freekv_attention(q.contiguous(), resident(resident_k_), resident(resident_v_),
                                front.k, front.v, slots, scale, device_.attention);

  bool offloaded = false;
  if (window_len_ >= options_.window_tokens + options_.page_tokens) {
    offload_page();
    offloaded = true;
  }
  // Above 1, tau corrects every head at the next step (a cosine is at most 1): synchronous
  // retrieval, which recalls nothing ahead.
  q_prev_ = q.clone();
  if (slots_ > 0 && num_pages_ > 0 && options_.tau <= 1.0) {
    // A new page: select again. On the CPU here (no idle core to hide it behind: on the recall
    // thread it only competes with this one), on CUDA on the recall thread (its result is read
    // on the host: a synchronization of the copy stream instead of the compute stream).
    if (offloaded) selected.clear();
    if (selected.empty() && !cuda_) selected = select(q, scale);
    start_recall(std::move(selected), q_prev_, scale);
  } else if (slots_ == 0 || num_pages_ == 0) {
    for (std::vector<int64_t>& pages : buffers_[1 - front_].pages) pages.clear();
  }
  stats_.steps += 1;
  stats_.head_steps += num_kv_heads_;
  stats_.corrected_heads += retrieves ? num_corrected : 0;
  return out;
}

}  // namespace strata::executor
