// The KV pool's memory (private to the executor): the device pages of kv/page_layout.h, the host
// pages preempted sequences swap to, and blocks of any format read and written through the page
// formats' libtorch reference (kernels/kv_format_ops.h).
//
// Layouts:
//   device pages  uint8 [num_pages, page_bytes] on the compute device
//   host pages    uint8 [num_host_pages, page_bytes] (pinned with CUDA); undefined: no swapping
//   base_view()   the device pages as base-format blocks, [num_pages * page_blocks, 2 (K, V),
//                 num_kv_heads, block_size_tokens, head_dim] in the compute dtype: what the paged
//                 attention and cache-write kernels read and write, indexed by base_index()
//   blocks        read() and write() take and give [n, 2, heads, block_size_tokens, head_dim]
//                 in the compute dtype, dequantized from / quantized into the format; `heads` is
//                 the blocks' KV heads (a per-head table's group), 0 for all of them
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "strata/common/status.h"
#include "strata/kv/kv_types.h"
#include "strata/kv/page_layout.h"

namespace strata::executor {

class KvPool {
 public:
  KvPool() = default;
  // RESOURCE_EXHAUSTED when the memory cannot be had.
  static StatusOr<KvPool> allocate(kv::PageLayout layout, int64_t num_pages, int64_t num_host_pages,
                                   at::Device device, at::ScalarType dtype, int64_t num_kv_heads,
                                   int64_t block_size_tokens, int64_t head_dim);

  const kv::PageLayout& layout() const { return layout_; }
  int64_t num_pages() const { return pages_.size(0); }
  int64_t num_host_pages() const { return host_pages_.defined() ? host_pages_.size(0) : 0; }
  // Whether `block` exists in a pool of `pages` pages as a block of that kind.
  bool is_valid(kv::BlockId block, const kv::KvFormat& format, int32_t heads, int64_t pages) const;
  at::Tensor& base_view() { return base_view_; }

  // Device blocks of one kind, in the compute dtype.
  at::Tensor read(const std::vector<kv::BlockId>& blocks, const kv::KvFormat& format,
                  int32_t heads = 0) const;
  void write(const std::vector<kv::BlockId>& blocks, const kv::KvFormat& format, int32_t heads,
             const at::Tensor& values);
  // Copies blocks byte for byte (each in its own format): device -> host (swap-out), host ->
  // device (swap-in), or device -> device.
  enum class Side { kDevice, kHost };
  void copy(const std::vector<kv::BlockCopy>& copies, Side from, Side to);

 private:
  // The blocks of one slot (the same byte range of their pages): their pages, and their rows in
  // the list they came from, as index tensors on the pool's device.
  struct SlotRun {
    int32_t slot = 0;
    at::Tensor pages;
    at::Tensor rows;
  };
  std::vector<SlotRun> by_slot(const std::vector<kv::BlockId>& blocks, at::Device device) const;
  // [n, block_bytes(kind)] bytes of blocks of one kind, and their inverse.
  at::Tensor gather(const at::Tensor& pages, const std::vector<kv::BlockId>& blocks,
                    const kv::BlockKind& kind) const;
  void scatter(at::Tensor& pages, const std::vector<kv::BlockId>& blocks, const kv::BlockKind& kind,
               const at::Tensor& bytes) const;
  bool is_base(const kv::KvFormat& format, int32_t heads) const {
    return format == layout_.base() && (heads == 0 || heads == heads_);
  }
  at::Tensor base_indices(const std::vector<kv::BlockId>& blocks) const;

  kv::PageLayout layout_;
  at::Tensor pages_;
  at::Tensor host_pages_;
  at::Tensor base_view_;
  at::ScalarType dtype_{};
  int64_t heads_ = 0, block_ = 0, dim_ = 0;
};

}  // namespace strata::executor
