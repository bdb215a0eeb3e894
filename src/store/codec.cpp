#include "strata/store/codec.h"

#include <zstd.h>

#include <cstring>
#include <string>

#include "strata/common/check.h"

namespace strata::store {

Status encode(CodecKind codec, std::span<const std::byte> raw, std::vector<std::byte>* out) {
  STRATA_CHECK(codec == CodecKind::kZstd) << "encode() of the identity codec";
  out->resize(ZSTD_compressBound(raw.size()));
  const size_t n = ZSTD_compress(out->data(), out->size(), raw.data(), raw.size(), /*level=*/1);
  if (ZSTD_isError(n)) return internal_error(std::string("zstd: ") + ZSTD_getErrorName(n));
  out->resize(n);
  return Status();
}

Status decode(CodecKind codec, std::span<const std::byte> encoded, std::span<std::byte> raw) {
  if (codec == CodecKind::kIdentity) {
    if (encoded.size() != raw.size()) {
      return data_loss_error("stored chunk of " + std::to_string(encoded.size()) +
                             " bytes, expected " + std::to_string(raw.size()));
    }
    std::memcpy(raw.data(), encoded.data(), raw.size());
    return Status();
  }
  const size_t n = ZSTD_decompress(raw.data(), raw.size(), encoded.data(), encoded.size());
  if (ZSTD_isError(n) || n != raw.size()) {
    return data_loss_error(std::string("zstd: ") +
                           (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong decoded size"));
  }
  return Status();
}

}  // namespace strata::store
