#include "strata/kv/page_layout.h"

#include <algorithm>

#include "strata/common/check.h"

namespace strata::kv {

StatusOr<PageLayout> PageLayout::create(KvFormat base, std::vector<KvFormat> others,
                                        int32_t page_blocks, int64_t num_kv_heads,
                                        int64_t block_size_tokens, int64_t head_dim,
                                        std::vector<int32_t> head_groups) {
  if (page_blocks < 1) {
    return invalid_argument_error("a page must hold at least one base block, got " +
                                  std::to_string(page_blocks));
  }
  PageLayout layout;
  layout.formats_ = {base};
  for (const KvFormat& f : others) {
    if (!layout.holds(f)) layout.formats_.push_back(f);
  }
  layout.num_kv_heads_ = static_cast<int32_t>(num_kv_heads);
  layout.page_blocks_ = page_blocks;
  layout.page_bytes_ =
      page_blocks * kv::block_bytes(base, num_kv_heads, block_size_tokens, head_dim);
  std::vector<int32_t> heads = {static_cast<int32_t>(num_kv_heads)};
  for (int32_t g : head_groups) {
    if (g < 1 || num_kv_heads % g != 0) {
      return invalid_argument_error("KV head groups: " + std::to_string(g) + " does not divide " +
                                    std::to_string(num_kv_heads) + " KV heads");
    }
    const int32_t h = static_cast<int32_t>(num_kv_heads / g);
    if (std::find(heads.begin(), heads.end(), h) == heads.end()) heads.push_back(h);
  }
  for (const KvFormat& f : layout.formats_) {
    STRATA_RETURN_IF_ERROR(validate(f.key, head_dim, block_size_tokens));
    STRATA_RETURN_IF_ERROR(validate(f.value, head_dim, block_size_tokens));
    for (int32_t h : heads) {
      const int64_t bytes = kv::block_bytes(f, h, block_size_tokens, head_dim);
      const int64_t per_page = layout.page_bytes_ / bytes;
      const std::string name =
          "KV format " + format_name(f) + " with " + std::to_string(h) + " head(s) a block";
      if (per_page < 1) {
        return invalid_argument_error(name + ": a block of " + std::to_string(bytes) +
                                      " bytes does not fit a page of " +
                                      std::to_string(layout.page_bytes_));
      }
      if (per_page > 64) {
        return invalid_argument_error(name + ": " + std::to_string(per_page) +
                                      " blocks per page (at most 64); use fewer page_blocks");
      }
      layout.kinds_.push_back({f, h});
      layout.block_bytes_.push_back(bytes);
      layout.blocks_per_page_.push_back(static_cast<int32_t>(per_page));
    }
  }
  layout.stride_ =
      *std::max_element(layout.blocks_per_page_.begin(), layout.blocks_per_page_.end());
  return layout;
}

PageLayout PageLayout::of(const KvGeometry& geometry, const KvFormat& base) {
  StatusOr<PageLayout> layout =
      create(base, geometry.formats, geometry.page_blocks, geometry.num_kv_heads,
             geometry.block_size_tokens, geometry.head_dim, geometry.head_groups);
  STRATA_CHECK(layout.ok()) << layout.status().to_string();
  return std::move(layout).value();
}

bool PageLayout::holds(const KvFormat& format, int32_t heads) const {
  if (kinds_.empty()) return std::find(formats_.begin(), formats_.end(), format) != formats_.end();
  return std::find(kinds_.begin(), kinds_.end(), kind(format, heads)) != kinds_.end();
}

size_t PageLayout::index_of(const KvFormat& format, int32_t heads) const {
  const auto it = std::find(kinds_.begin(), kinds_.end(), kind(format, heads));
  STRATA_CHECK(it != kinds_.end())
      << "KV format " << format_name(format) << " with " << kind(format, heads).heads
      << " head(s) a block is not one of the pool's";
  return static_cast<size_t>(it - kinds_.begin());
}

int64_t PageLayout::block_bytes(const KvFormat& format, int32_t heads) const {
  if (block_bytes_.empty()) return 0;
  return block_bytes_[index_of(format, heads)];
}

int32_t PageLayout::blocks_per_page(const KvFormat& format, int32_t heads) const {
  if (blocks_per_page_.empty()) return 1;
  return blocks_per_page_[index_of(format, heads)];
}

}  // namespace strata::kv
