#include "strata/kv/page_layout.h"

#include <algorithm>

#include "strata/common/check.h"

namespace strata::kv {

StatusOr<PageLayout> PageLayout::create(KvFormat base, std::vector<KvFormat> others,
                                        int32_t page_blocks, int64_t num_kv_heads,
                                        int64_t block_size_tokens, int64_t head_dim) {
  if (page_blocks < 1) {
    return invalid_argument_error("a page must hold at least one base block, got " +
                                  std::to_string(page_blocks));
  }
  PageLayout layout;
  layout.formats_ = {base};
  for (const KvFormat& f : others) {
    if (!layout.holds(f)) layout.formats_.push_back(f);
  }
  layout.page_blocks_ = page_blocks;
  layout.page_bytes_ = page_blocks * kv::block_bytes(base, num_kv_heads, block_size_tokens, head_dim);
  for (const KvFormat& f : layout.formats_) {
    STRATA_RETURN_IF_ERROR(validate(f.key, head_dim, block_size_tokens));
    STRATA_RETURN_IF_ERROR(validate(f.value, head_dim, block_size_tokens));
    const int64_t bytes = kv::block_bytes(f, num_kv_heads, block_size_tokens, head_dim);
    const int64_t per_page = layout.page_bytes_ / bytes;
    if (per_page < 1) {
      return invalid_argument_error("KV format " + format_name(f) + ": a block of " +
                                    std::to_string(bytes) + " bytes does not fit a page of " +
                                    std::to_string(layout.page_bytes_));
    }
    if (per_page > 64) {
      return invalid_argument_error("KV format " + format_name(f) + ": " +
                                    std::to_string(per_page) +
                                    " blocks per page (at most 64); use fewer page_blocks");
    }
    layout.block_bytes_.push_back(bytes);
    layout.blocks_per_page_.push_back(static_cast<int32_t>(per_page));
  }
  layout.stride_ = *std::max_element(layout.blocks_per_page_.begin(), layout.blocks_per_page_.end());
  return layout;
}

PageLayout PageLayout::of(const KvGeometry& geometry, const KvFormat& base) {
  StatusOr<PageLayout> layout = create(base, geometry.formats, geometry.page_blocks,
                                       geometry.num_kv_heads, geometry.block_size_tokens,
                                       geometry.head_dim);
  STRATA_CHECK(layout.ok()) << layout.status().to_string();
  return std::move(layout).value();
}

bool PageLayout::holds(const KvFormat& format) const {
  return std::find(formats_.begin(), formats_.end(), format) != formats_.end();
}

namespace {
size_t index_of(const std::vector<KvFormat>& formats, const KvFormat& format) {
  const auto it = std::find(formats.begin(), formats.end(), format);
  STRATA_CHECK(it != formats.end()) << "KV format " << format_name(format)
                                     << " is not one of the pool's";
  return static_cast<size_t>(it - formats.begin());
}
}  // namespace

int64_t PageLayout::block_bytes(const KvFormat& format) const {
  if (block_bytes_.empty()) return 0;
  return block_bytes_[index_of(formats_, format)];
}

int32_t PageLayout::blocks_per_page(const KvFormat& format) const {
  if (blocks_per_page_.empty()) return 1;
  return blocks_per_page_[index_of(formats_, format)];
}

}  // namespace strata::kv
