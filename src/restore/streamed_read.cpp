#include "streamed_read.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "strata/common/check.h"
#include "strata/common/clock.h"

namespace strata::restore {
namespace {

// Layers read in one go grow 1, 2, 4, ... up to parts of this many bytes: the first layer's wait
// stays short, and later reads are large enough for the disk (a 12 KiB direct read costs about a
// fifth of a 360 KiB one on this machine's SSD).
constexpr int64_t kPartBytes = 64 << 10;

}  // namespace

StreamedRead::StreamedRead(store::KvStore& store, store::LayeredLease lease,
                           std::vector<int64_t> layer_first, Unmerge unmerge)
    : store_(store),
      lease_(std::move(lease)),
      layer_first_(std::move(layer_first)),
      unmerge_(std::move(unmerge)) {
  STRATA_CHECK(std::ranges::is_sorted(layer_first_, std::greater<>()))
      << "a streamed read's layers load more blocks with depth";
  STRATA_CHECK_EQ(std::ssize(layer_first_), store_.options().chunk_layers);
  STRATA_CHECK(!merged() || unmerge_) << "a streamed read of merged chunks without their restoring";
}

void StreamedRead::start() {
  STRATA_CHECK(!thread_.joinable()) << "a streamed read started twice";
  thread_ = std::thread([this] { run(); });
}

StreamedRead::~StreamedRead() {
  if (thread_.joinable()) thread_.join();
  if (!released_) store_.release(lease_.lease, 0);
}

void StreamedRead::run() {
  const int64_t layers = std::ssize(layer_first_);
  const int64_t count = std::ssize(lease_.from);
  const int64_t chunk_bytes = store_.options().chunk_bytes;
  const int64_t most = std::max<int64_t>(1, kPartBytes / (chunk_bytes / layers));
  const auto place = [&](int64_t layer) {
    return store_.layer_offset(lease_.lease.codec, lease_.lease.layer_pairs,
                               static_cast<int32_t>(layer));
  };
  if (merged()) {
    restored_.assign(static_cast<size_t>(count),
                     std::vector<std::byte>(static_cast<size_t>(store_.options().chunk_bytes)));
  }
  int64_t group = 1;
  for (int64_t begin = 0; begin < layers;) {
    int64_t end = std::min(layers, begin + group);
    // A merged pair's shallow layer is restored from its deep layer's place: both come together.
    for (bool grew = true; grew;) {
      grew = false;
      for (const kv::krul::LayerPair& p : lease_.lease.layer_pairs) {
        if (p.shallow >= begin && p.shallow < end && p.deep >= end) {
          end = p.deep + 1;
          grew = true;
        }
      }
    }
    // Chunk j is loaded by layers [first layer loading it, layers): its part in [begin, end).
    std::vector<store::LayerPart> parts;
    int64_t part_bytes = 0;
    for (int64_t j = layer_first_[end - 1]; j < count; ++j) {
      if (lease_.from[j] == store::kDramTier) continue;
      int64_t from = begin;
      while (from < end && layer_first_[from] > j) ++from;
      parts.push_back({j, static_cast<int32_t>(from), static_cast<int32_t>(end)});
      part_bytes += place(end) - place(from);
    }
    const auto start = std::chrono::steady_clock::now();
    Status read = store_.read_layers(&lease_, parts);
    const double seconds = seconds_since(start);
    StatusOr<int64_t> restored = int64_t{0};
    const auto restore_start = std::chrono::steady_clock::now();
    if (read.ok() && merged()) restored = restore(begin, end);
    if (!restored.ok()) read = restored.status();
    const double restore_seconds = seconds_since(restore_start);
    std::scoped_lock lock(mutex_);
    if (!read.ok()) {
      outcome_.status = read;
      failed_ = true;
      break;
    }
    outcome_.seconds += seconds;
    outcome_.chunks += static_cast<double>(part_bytes) / static_cast<double>(chunk_bytes);
    if (*restored > 0) {
      outcome_.restore_seconds += restore_seconds;
      outcome_.restored_layers += *restored;
    }
    layers_read_ = end;
    arrived_.notify_all();
    begin = end;
    group = std::min(group * 2, most);
  }
  std::scoped_lock lock(mutex_);
  layers_read_ = layers;
  arrived_.notify_all();
}

StatusOr<int64_t> StreamedRead::restore(int64_t begin, int64_t end) {
  // Chunk j is restored from the first layer of [begin, end) that loads it: the layers before
  // recompute it, and its bytes they are restored from may not have been read. Layer l loads
  // chunks [layer_first_[l], count), so the chunks layer `from` is the first to load are those up
  // to where the layer before it starts.
  const int64_t count = std::ssize(lease_.from);
  int64_t restored = 0;
  for (int64_t from = begin; from < end; ++from) {
    const int64_t last = from == begin ? count : std::min(count, layer_first_[from - 1]);
    std::vector<const std::byte*> in;
    std::vector<std::byte*> out;
    for (int64_t j = layer_first_[from]; j < last; ++j) {
      in.push_back(lease_.lease.chunks[j]);
      out.push_back(restored_[j].data());
    }
    if (in.empty()) continue;
    STRATA_RETURN_IF_ERROR(
        unmerge_(in, out, static_cast<int32_t>(from), static_cast<int32_t>(end)));
    restored += std::ssize(in) * (end - from);
  }
  return restored;
}

const std::byte* StreamedRead::wait(int64_t j, int64_t layer) const {
  std::unique_lock lock(mutex_);
  arrived_.wait(lock, [&] { return layers_read_ > layer; });
  if (failed_) return nullptr;
  return merged() ? restored_[j].data() : lease_.lease.chunks[j];
}

StreamedRead::Outcome StreamedRead::finish() {
  if (thread_.joinable()) thread_.join();
  Outcome outcome = std::exchange(outcome_, {});
  outcome.lease = lease_.lease;
  released_ = true;
  return outcome;
}

}  // namespace strata::restore
