#include "streamed_read.h"

#include <chrono>
#include <numeric>

#include "strata/common/check.h"

namespace strata::restore {

StreamedRead::StreamedRead(store::KvStore& store, store::ItemId item, int64_t skipped_chunks,
                           int64_t first, int64_t count, std::vector<int64_t> pieces)
    : store_(store),
      item_(item),
      skipped_chunks_(skipped_chunks),
      first_(first),
      pieces_(std::move(pieces)),
      chunks_(static_cast<size_t>(count), nullptr) {
  STRATA_CHECK_EQ(std::accumulate(pieces_.begin(), pieces_.end(), int64_t{0}), count);
}

void StreamedRead::start() {
  STRATA_CHECK(!thread_.joinable()) << "a streamed read started twice";
  thread_ = std::thread([this] { run(); });
}

StreamedRead::~StreamedRead() {
  if (thread_.joinable()) thread_.join();
  for (const store::StoreLease& lease : outcome_.leases) store_.release(lease, 0);
}

void StreamedRead::run() {
  int64_t end = std::ssize(chunks_);
  for (const int64_t size : pieces_) {
    const int64_t begin = end - size;
    const auto start = std::chrono::steady_clock::now();
    StatusOr<store::StoreLease> lease =
        store_.acquire(item_, first_ + begin, size, skipped_chunks_);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::scoped_lock lock(mutex_);
    // Streamed loads are raw: an item re-encoded since its first chunk was pinned cannot be (the
    // pin keeps its codec), so another codec is a failure like a lost chunk.
    if (lease.ok() && lease->codec != 0) {
      store_.release(*lease, 0);
      lease = internal_error("KV store: a streamed load's item changed its codec");
    }
    if (!lease.ok()) {
      outcome_.status = lease.status();
      break;
    }
    for (int64_t j = 0; j < size; ++j) chunks_[begin + j] = lease->chunks[j];
    outcome_.seconds += seconds;
    outcome_.chunks += size;
    outcome_.leases.push_back(*std::move(lease));
    arrived_.notify_all();
    end = begin;
  }
  std::scoped_lock lock(mutex_);
  done_ = true;
  arrived_.notify_all();
}

const std::byte* StreamedRead::wait(int64_t j) const {
  std::unique_lock lock(mutex_);
  arrived_.wait(lock, [&] { return chunks_[j] != nullptr || done_; });
  return chunks_[j];
}

StreamedRead::Outcome StreamedRead::finish() {
  if (thread_.joinable()) thread_.join();
  return std::exchange(outcome_, {});
}

}  // namespace strata::restore
