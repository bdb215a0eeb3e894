// The store's first tier: one arena of host DRAM (pinned through the register hook when the
// device is a GPU), cut into kIoAlignment pages; each value takes contiguous pages (best fit), so
// the device copies a chunk with one transfer. Values are held as they are (identity codec): the
// executor reads loads from, and writes saves into, this memory directly (address()).
#pragma once

#include <functional>
#include <mutex>
#include <unordered_map>

#include "strata/store/tier.h"

namespace strata::store {

struct DramOptions {
  int64_t capacity_bytes = 0;
  // Called once with the arena (e.g. cudaHostRegister for fast device copies); optional.
  std::function<void(void* data, size_t bytes)> register_host_memory;
  std::function<void(void* data)> unregister_host_memory;
};

class DramTier final : public Tier {
 public:
  // RESOURCE_EXHAUSTED when the arena cannot be mapped.
  static StatusOr<std::unique_ptr<DramTier>> open(DramOptions options);
  ~DramTier() override;
  DramTier(const DramTier&) = delete;
  DramTier& operator=(const DramTier&) = delete;

  const std::string& name() const override { return name_; }
  CodecKind codec() const override { return CodecKind::kIdentity; }
  int64_t capacity_bytes() const override { return arena_bytes_; }
  int64_t used_bytes() const override;
  int64_t footprint(int64_t bytes) const override;
  bool available() const override { return true; }
  std::optional<Reservation> reserve(std::span<const int64_t> sizes) override;
  void cancel(const Reservation& reservation) override;
  // A value already at its placement's address (written in place) is not copied.
  Status put(const ItemRecord& item, const Reservation& reservation, std::span<const ChunkKey> keys,
             std::span<const std::span<const std::byte>> values) override;
  Status get(ItemId item, std::span<const int32_t> indices,
             std::span<AlignedBuffer> out) const override;
  bool contains(const ChunkKey& key) const override;
  Status evict(ItemId item) override;

  // How many values of `bytes` bytes reserve() could place at once now (each takes contiguous
  // pages, so values of other sizes may leave the free pages in pieces too small).
  int64_t fitting(int64_t bytes) const;
  // The memory of a reserved or held placement.
  std::byte* address(const Placement& placement) const;
  // Where chunk `index` of `item` is held; nullptr if it is not.
  std::byte* find(ItemId item, int32_t index) const;

 private:
  explicit DramTier(DramOptions options);

  const std::string name_ = "dram";
  DramOptions options_;
  std::byte* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  mutable std::mutex mutex_;
  ExtentAllocator pages_;
  // item -> its held values by chunk index (bytes == 0: not held).
  std::unordered_map<ItemId, std::vector<Placement>> values_;
};

}  // namespace strata::store
