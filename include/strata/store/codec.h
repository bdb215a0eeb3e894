// Codecs at the KV store's storage boundary: how a tier encodes the chunks it holds. The device
// reads and writes raw chunks in host DRAM, so DRAM holds them as they are (identity); a tier
// below it may hold them compressed, and a value is decoded on its way back up.
//
//   identity  the chunk's bytes
//   zstd      lossless zstd (level 1: KV is high-entropy float data; the seam for lossy codecs)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "strata/common/status.h"

namespace strata::store {

enum class CodecKind : uint8_t { kIdentity = 0, kZstd = 1 };

inline const char* codec_name(CodecKind codec) {  // "identity" | "zstd"
  return codec == CodecKind::kZstd ? "zstd" : "identity";
}

// Appends the encoding of `raw` to `out` (cleared first). REQUIRES codec != kIdentity.
Status encode(CodecKind codec, std::span<const std::byte> raw, std::vector<std::byte>* out);
// Decodes `encoded` into `raw`, which must receive exactly raw.size() bytes: DATA_LOSS otherwise.
Status decode(CodecKind codec, std::span<const std::byte> encoded, std::span<std::byte> raw);

}  // namespace strata::store
