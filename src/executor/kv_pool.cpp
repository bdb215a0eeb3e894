#include "kv_pool.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "strata/kernels/kv_format_ops.h"

namespace strata::executor {

StatusOr<KvPool> KvPool::allocate(kv::PageLayout layout, int64_t num_pages, int64_t num_host_pages,
                                  at::Device device, at::ScalarType dtype, int64_t num_kv_heads,
                                  int64_t block_size_tokens, int64_t head_dim) {
  KvPool pool;
  pool.layout_ = std::move(layout);
  pool.dtype_ = dtype;
  pool.heads_ = num_kv_heads;
  pool.block_ = block_size_tokens;
  pool.dim_ = head_dim;
  const int64_t page_bytes = pool.layout_.page_bytes();
  try {
    pool.pages_ =
        at::zeros({num_pages, page_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    if (num_host_pages > 0) {
      pool.host_pages_ =
          at::empty({num_host_pages, page_bytes},
                    at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda()));
    }
  } catch (const std::exception& e) {
    return resource_exhausted_error("cannot allocate the KV pool: " + std::string(e.what()));
  }
  pool.base_view_ = pool.pages_.view({-1}).view(dtype).view(
      {num_pages * pool.layout_.page_blocks(), 2, num_kv_heads, block_size_tokens, head_dim});
  return pool;
}

bool KvPool::is_valid(kv::BlockId block, const kv::KvFormat& format, int32_t heads,
                      int64_t pages) const {
  return layout_.holds(format, heads) && block.value >= 0 && layout_.page_of(block) < pages &&
         layout_.slot_of(block) < layout_.blocks_per_page(format, heads);
}

at::Tensor KvPool::base_indices(const std::vector<kv::BlockId>& blocks) const {
  std::vector<int64_t> indices;
  indices.reserve(blocks.size());
  for (kv::BlockId b : blocks) indices.push_back(layout_.base_index(b));
  return at::tensor(indices, at::kLong).to(pages_.device());
}

std::vector<KvPool::SlotRun> KvPool::by_slot(const std::vector<kv::BlockId>& blocks,
                                             at::Device device) const {
  std::map<int32_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>> runs;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& [pages, rows] = runs[layout_.slot_of(blocks[i])];
    pages.push_back(layout_.page_of(blocks[i]));
    rows.push_back(static_cast<int64_t>(i));
  }
  std::vector<SlotRun> out;
  for (const auto& [slot, ids] : runs) {
    out.push_back({slot, at::tensor(ids.first, at::kLong).to(device),
                   at::tensor(ids.second, at::kLong).to(device)});
  }
  return out;
}

at::Tensor KvPool::gather(const at::Tensor& pages, const std::vector<kv::BlockId>& blocks,
                          const kv::BlockKind& kind) const {
  const int64_t bytes = layout_.block_bytes(kind.format, kind.heads);
  at::Tensor out = at::empty({static_cast<int64_t>(blocks.size()), bytes}, pages.options());
  for (const SlotRun& run : by_slot(blocks, pages.device())) {
    out.index_copy_(0, run.rows,
                    pages.index_select(0, run.pages).narrow(1, run.slot * bytes, bytes));
  }
  return out;
}

void KvPool::scatter(at::Tensor& pages, const std::vector<kv::BlockId>& blocks,
                     const kv::BlockKind& kind, const at::Tensor& bytes) const {
  const int64_t size = layout_.block_bytes(kind.format, kind.heads);
  const at::Tensor source = bytes.to(pages.device());
  for (const SlotRun& run : by_slot(blocks, pages.device())) {
    at::Tensor region = pages.narrow(1, run.slot * size, size);
    region.index_copy_(0, run.pages, source.index_select(0, run.rows));
  }
}

at::Tensor KvPool::read(const std::vector<kv::BlockId>& blocks, const kv::KvFormat& format,
                        int32_t heads) const {
  if (is_base(format, heads)) return base_view_.index_select(0, base_indices(blocks));
  const kv::BlockKind kind = layout_.kind(format, heads);
  return kernels::aten::unpack_kv_blocks(gather(pages_, blocks, kind), format, kind.heads, block_,
                                         dim_)
      .to(dtype_);
}

void KvPool::write(const std::vector<kv::BlockId>& blocks, const kv::KvFormat& format,
                   int32_t heads, const at::Tensor& values) {
  if (is_base(format, heads)) {
    base_view_.index_copy_(0, base_indices(blocks), values.to(dtype_));
    return;
  }
  scatter(pages_, blocks, layout_.kind(format, heads),
          kernels::aten::pack_kv_blocks(values, format));
}

void KvPool::copy(const std::vector<kv::BlockCopy>& copies, Side from, Side to) {
  at::Tensor& source = from == Side::kDevice ? pages_ : host_pages_;
  at::Tensor& destination = to == Side::kDevice ? pages_ : host_pages_;
  // One gather and one scatter per kind, in the copies' order within it (a copy list never
  // writes a block another copy of the same list reads).
  std::vector<kv::BlockKind> kinds;
  for (const kv::BlockCopy& c : copies) {
    const kv::BlockKind kind = layout_.kind(c.format, c.heads);
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  for (const kv::BlockKind& kind : kinds) {
    std::vector<kv::BlockId> sources, destinations;
    for (const kv::BlockCopy& c : copies) {
      if (!(layout_.kind(c.format, c.heads) == kind)) continue;
      sources.push_back(c.source);
      destinations.push_back(c.destination);
    }
    scatter(destination, destinations, kind, gather(source, sources, kind));
  }
}

}  // namespace strata::executor
