#include "freekv_layer.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "strata/kernels/freekv_ops.h"

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
                                  ") must be multiples of page_tokens (" + std::to_string(p) +
                                  ")");
  }
  if (std::isnan(o.tau)) return invalid_argument_error("freekv: tau must be a number");
  if (o.budget_tokens < o.sink_tokens + o.window_tokens) {
    return invalid_argument_error("freekv: budget_tokens (" + std::to_string(o.budget_tokens) +
                                  ") is less than sink_tokens + window_tokens");
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

FreeKvLayer::FreeKvLayer(const FreeKvConfig& options, int64_t num_kv_heads, int64_t head_dim,
                         at::ScalarType dtype, RecallWorker& worker)
    : options_(options),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      slots_((options.budget_tokens - options.sink_tokens - options.window_tokens) /
             options.page_tokens),
      dtype_(dtype),
      element_bytes_(static_cast<int64_t>(c10::elementSize(dtype))),
      worker_(worker) {
  const int64_t p = options_.page_tokens;
  const auto opts = at::TensorOptions().dtype(dtype_);
  resident_k_ = at::empty(
      {options_.sink_tokens + options_.window_tokens + p, num_kv_heads_, head_dim_}, opts);
  resident_v_ = at::empty_like(resident_k_);
  host_ = at::empty({0, num_kv_heads_, 2, p, head_dim_}, opts);
  kmin_ = at::empty({0, num_kv_heads_, head_dim_}, opts);
  kmax_ = at::empty_like(kmin_);
  for (Buffer& b : buffers_) {
    b.k = at::zeros({slots_, p, num_kv_heads_, head_dim_}, opts);
    b.v = at::zeros_like(b.k);
    b.pages.assign(num_kv_heads_, {});
  }
}

FreeKvLayer::~FreeKvLayer() { wait_recall(); }

void FreeKvLayer::start_recall(std::vector<std::vector<int64_t>> selected) {
  Buffer& back = buffers_[1 - front_];
  const Buffer& front = buffers_[front_];
  recall_posted_ = true;
  worker_.post(
      [this, selected = std::move(selected), &back, &front] {
        const auto start = std::chrono::steady_clock::now();
        recall(selected, std::vector<bool>(num_kv_heads_, true), back, front);
        recall_ns_ += nanoseconds_since(start);
      },
      &recall_pending_);
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
    const int64_t capacity = std::max<int64_t>(16, 2 * num_pages_);
    at::Tensor host = at::empty({capacity, num_kv_heads_, 2, p, head_dim_}, host_.options());
    host.narrow(0, 0, num_pages_).copy_(host_.narrow(0, 0, num_pages_));
    at::Tensor kmin = at::empty({capacity, num_kv_heads_, head_dim_}, kmin_.options());
    at::Tensor kmax = at::empty_like(kmin);
    kmin.narrow(0, 0, num_pages_).copy_(kmin_.narrow(0, 0, num_pages_));
    kmax.narrow(0, 0, num_pages_).copy_(kmax_.narrow(0, 0, num_pages_));
    host_ = std::move(host);
    kmin_ = std::move(kmin);
    kmax_ = std::move(kmax);
  }
  // Token-major [p, n_kv, d] -> head-major [n_kv, 2, p, d], with the page's summary.
  at::Tensor page = host_.select(0, num_pages_);
  at::Tensor lo = kmin_.select(0, num_pages_), hi = kmax_.select(0, num_pages_);
  const int64_t start = options_.sink_tokens;
  ka::freekv_offload(resident_k_.narrow(0, start, p), resident_v_.narrow(0, start, p), page, lo,
                     hi);
  ++num_pages_;
  const int64_t rest = window_len_ - p;
  if (rest > 0) {
    resident_k_.narrow(0, start, rest).copy_(resident_k_.narrow(0, start + p, rest).clone());
    resident_v_.narrow(0, start, rest).copy_(resident_v_.narrow(0, start + p, rest).clone());
  }
  window_len_ = rest;
}

at::Tensor FreeKvLayer::select(const at::Tensor& q, double scale) const {
  return ka::freekv_select(q, kmin_.narrow(0, 0, num_pages_), kmax_.narrow(0, 0, num_pages_),
                           slots_, scale);
}

void FreeKvLayer::recall(const std::vector<std::vector<int64_t>>& selected,
                         const std::vector<bool>& heads, Buffer& into, const Buffer& from) {
  const int64_t p = options_.page_tokens, d = head_dim_, es = element_bytes_;
  const int64_t row = d * es;  // one token of one head
  auto* dst_k = static_cast<std::byte*>(into.k.data_ptr());
  auto* dst_v = static_cast<std::byte*>(into.v.data_ptr());
  const auto* host = static_cast<const std::byte*>(host_.data_ptr());
  const auto* from_k = static_cast<const std::byte*>(from.k.data_ptr());
  const auto* from_v = static_cast<const std::byte*>(from.v.data_ptr());
  // Offsets in elements: cache [slot, t, m, :]; host [page, m, kv, t, :].
  auto cache_at = [&](int64_t slot, int64_t t, int64_t m) {
    return ((slot * p + t) * num_kv_heads_ + m) * row;
  };
  auto host_at = [&](int64_t page, int64_t m, int64_t kv, int64_t t) {
    return (((page * num_kv_heads_ + m) * 2 + kv) * p + t) * row;
  };
  for (int64_t m = 0; m < num_kv_heads_; ++m) {
    if (!heads[m]) continue;
    const std::vector<int64_t>& pages = selected[m];
    // The slot of `from` that holds each page (-1: none, or recalling in place).
    std::vector<int64_t> held(pages.size(), -1);
    for (size_t i = 0; i < pages.size() && &from != &into; ++i) {
      for (size_t s = 0; s < from.pages[m].size(); ++s) {
        if (from.pages[m][s] == pages[i]) held[i] = static_cast<int64_t>(s);
      }
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      const int64_t slot = static_cast<int64_t>(i);
      for (int64_t t = 0; t < p; ++t) {
        if (held[i] >= 0) {
          std::memcpy(dst_k + cache_at(slot, t, m), from_k + cache_at(held[i], t, m), row);
          std::memcpy(dst_v + cache_at(slot, t, m), from_v + cache_at(held[i], t, m), row);
        } else {
          std::memcpy(dst_k + cache_at(slot, t, m), host + host_at(pages[i], m, 0, t), row);
          std::memcpy(dst_v + cache_at(slot, t, m), host + host_at(pages[i], m, 1, t), row);
        }
      }
      ++(held[i] >= 0 ? reused_pages_ : recalled_pages_);
    }
    into.pages[m] = pages;
  }
}

void FreeKvLayer::wait_recall_timed() {
  if (!recall_posted_) return;
  const auto start = std::chrono::steady_clock::now();
  wait_recall();
  exposed_ns_ += nanoseconds_since(start);
  recall_posted_ = false;
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
  wait_recall();
  append(k.to(dtype_), v.to(dtype_));
}

at::Tensor FreeKvLayer::decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               double scale) {
  wait_recall_timed();
  front_ = 1 - front_;  // what the previous step recalled
  Buffer& front = buffers_[front_];
  append(k.to(dtype_).unsqueeze(0), v.to(dtype_).unsqueeze(0));

  // Which KV heads read pages selected with this query: all at the first step (no previous
  // query), else those whose query moved (similarity below tau).
  std::vector<bool> corrected(num_kv_heads_, true);
  if (q_prev_.defined()) {
    const at::Tensor similarity = ka::freekv_query_similarity(q, q_prev_, num_kv_heads_);
    for (int64_t m = 0; m < num_kv_heads_; ++m) {
      corrected[m] = similarity[m].item<double>() < options_.tau;
    }
  }
  int64_t num_corrected = 0;
  for (bool c : corrected) num_corrected += c ? 1 : 0;
  auto as_lists = [&](const at::Tensor& selected) {
    std::vector<std::vector<int64_t>> lists(num_kv_heads_);
    const at::Tensor s = selected.contiguous();
    for (int64_t m = 0; m < num_kv_heads_; ++m) {
      const int64_t* row = s[m].data_ptr<int64_t>();
      lists[m].assign(row, row + s.size(1));
    }
    return lists;
  };
  std::vector<std::vector<int64_t>> selected;
  const bool retrieves = slots_ > 0 && num_pages_ > 0;  // else StreamingLLM: sink + window
  if (num_corrected > 0 && retrieves) {
    const auto start = std::chrono::steady_clock::now();
    selected = as_lists(select(q, scale));
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
  const at::Tensor slots = at::tensor(counts, at::kLong);
  at::Tensor out = ka::freekv_attention(q, resident(resident_k_), resident(resident_v_), front.k,
                                        front.v, slots, scale);

  bool offloaded = false;
  if (window_len_ >= options_.window_tokens + options_.page_tokens) {
    offload_page();
    offloaded = true;
  }
  // Above 1, tau corrects every head at the next step (a cosine is at most 1): synchronous
  // retrieval, which recalls nothing ahead.
  if (slots_ > 0 && num_pages_ > 0 && options_.tau <= 1.0) {
    if (selected.empty() || offloaded) selected = as_lists(select(q, scale));
    start_recall(std::move(selected));
  } else if (slots_ == 0 || num_pages_ == 0) {
    for (std::vector<int64_t>& pages : buffers_[1 - front_].pages) pages.clear();
  }
  q_prev_ = q.clone();
  stats_.steps += 1;
  stats_.head_steps += num_kv_heads_;
  stats_.corrected_heads += retrieves ? num_corrected : 0;
  return out;
}

}  // namespace strata::executor
