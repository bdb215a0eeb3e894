#include "strata/store/dram_tier.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "strata/common/check.h"

namespace strata::store {

AlignedBuffer::AlignedBuffer(int64_t bytes)
    : data_(static_cast<std::byte*>(
          std::aligned_alloc(kIoAlignment, static_cast<size_t>(round_up_to_page(std::max<int64_t>(bytes, 1)))))),
      size_(bytes),
      capacity_(round_up_to_page(std::max<int64_t>(bytes, 1))) {
  STRATA_CHECK(data_ != nullptr) << "cannot allocate " << bytes << " bytes";
}

void AlignedBuffer::resize(int64_t bytes) {
  STRATA_CHECK_LE(bytes, capacity_);
  size_ = bytes;
}

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

DramTier::DramTier(DramOptions options)
    : options_(std::move(options)),
      arena_bytes_(options_.capacity_bytes / kIoAlignment * kIoAlignment),
      pages_({{0, arena_bytes_ / kIoAlignment}}) {}

StatusOr<std::unique_ptr<DramTier>> DramTier::open(DramOptions options) {
  std::unique_ptr<DramTier> tier(new DramTier(std::move(options)));
  void* arena = ::mmap(nullptr, static_cast<size_t>(tier->arena_bytes_), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (arena == MAP_FAILED) {
    return resource_exhausted_error("store: cannot map " +
                                    std::to_string(tier->arena_bytes_ >> 20) + " MiB of DRAM");
  }
  tier->arena_ = static_cast<std::byte*>(arena);
  if (tier->options_.register_host_memory) {
    tier->options_.register_host_memory(arena, static_cast<size_t>(tier->arena_bytes_));
  }
  return tier;
}

DramTier::~DramTier() {
  if (options_.unregister_host_memory) options_.unregister_host_memory(arena_);
  ::munmap(arena_, static_cast<size_t>(arena_bytes_));
}

int64_t DramTier::used_bytes() const {
  std::scoped_lock lock(mutex_);
  return (pages_.num_slots() - pages_.num_free()) * kIoAlignment;
}

int64_t DramTier::footprint(int64_t bytes) const { return round_up_to_page(bytes); }

int64_t DramTier::fitting(int64_t bytes) const {
  std::scoped_lock lock(mutex_);
  return pages_.count_contiguous(footprint(bytes) / kIoAlignment);
}

std::optional<Reservation> DramTier::reserve(std::span<const int64_t> sizes) {
  std::scoped_lock lock(mutex_);
  Reservation r;
  for (int64_t bytes : sizes) {
    std::optional<Extent> pages = pages_.allocate_contiguous(footprint(bytes) / kIoAlignment);
    if (!pages) {
      for (const Placement& p : r.placements) pages_.free(p.extents[0]);
      return std::nullopt;
    }
    r.placements.push_back({{*pages}, bytes});
  }
  return r;
}

void DramTier::cancel(const Reservation& reservation) {
  std::scoped_lock lock(mutex_);
  for (const Placement& p : reservation.placements) pages_.free(p.extents[0]);
}

std::byte* DramTier::address(const Placement& placement) const {
  return arena_ + placement.extents[0].start * kIoAlignment;
}

Status DramTier::put(const ItemRecord&, const Reservation& reservation,
                     std::span<const ChunkKey> keys,
                     std::span<const std::span<const std::byte>> values) {
  STRATA_CHECK_EQ(keys.size(), reservation.placements.size());
  STRATA_CHECK_EQ(values.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    std::byte* dst = address(reservation.placements[i]);
    if (values[i].data() != dst) std::memcpy(dst, values[i].data(), values[i].size());
  }
  std::scoped_lock lock(mutex_);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<Placement>& held = values_[keys[i].item];
    if (std::ssize(held) <= keys[i].index) held.resize(static_cast<size_t>(keys[i].index) + 1);
    STRATA_CHECK_EQ(held[keys[i].index].bytes, 0) << "chunk " << keys[i].index << " put twice";
    held[keys[i].index] = reservation.placements[i];
  }
  return Status();
}

std::byte* DramTier::find(ItemId item, int32_t index) const {
  std::scoped_lock lock(mutex_);
  auto it = values_.find(item);
  if (it == values_.end() || std::ssize(it->second) <= index || it->second[index].bytes == 0) {
    return nullptr;
  }
  return address(it->second[index]);
}

Status DramTier::get(ItemId item, std::span<const int32_t> indices,
                     std::span<AlignedBuffer> out) const {
  std::scoped_lock lock(mutex_);
  auto it = values_.find(item);
  for (size_t i = 0; i < indices.size(); ++i) {
    if (it == values_.end() || std::ssize(it->second) <= indices[i] ||
        it->second[indices[i]].bytes == 0) {
      return not_found_error("dram: chunk " + std::to_string(indices[i]) + " of item " +
                             std::to_string(item) + " is not held");
    }
    const Placement& p = it->second[indices[i]];
    out[i] = AlignedBuffer(p.bytes);
    std::memcpy(out[i].data(), address(p), static_cast<size_t>(p.bytes));
  }
  return Status();
}

bool DramTier::contains(const ChunkKey& key) const { return find(key.item, key.index) != nullptr; }

Status DramTier::evict(ItemId item) {
  std::scoped_lock lock(mutex_);
  auto it = values_.find(item);
  if (it == values_.end()) return Status();
  for (const Placement& p : it->second) {
    if (p.bytes > 0) pages_.free(p.extents[0]);
  }
  values_.erase(it);
  return Status();
}

}  // namespace strata::store
