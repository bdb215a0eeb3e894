#include "strata/kv/prefix_hash.h"

#include <xxhash.h>

#include <cstring>
#include <string>
#include <vector>

namespace strata::kv {
namespace {

ChunkHash to_chunk_hash(XXH128_hash_t h) { return {h.low64, h.high64}; }

}  // namespace

ChunkHash prefix_root(uint64_t model_fingerprint, KvFormat format, int32_t block_size_tokens,
                      std::string_view tenant_salt) {
  // The format by its name ("bfloat16", "k:int8/token128,v:int4/token32"): every field counts.
  return prefix_root(model_fingerprint, format_name(format), block_size_tokens, tenant_salt);
}

ChunkHash prefix_root(uint64_t model_fingerprint, std::string_view name, int32_t block_size_tokens,
                      std::string_view tenant_salt) {
  std::vector<uint8_t> bytes(8 + 4 + name.size() + 1 + tenant_salt.size());
  std::memcpy(bytes.data(), &model_fingerprint, 8);
  std::memcpy(bytes.data() + 8, &block_size_tokens, 4);
  std::memcpy(bytes.data() + 12, name.data(), name.size());
  bytes[12 + name.size()] = 0;  // the name's end: no salt can extend it
  std::memcpy(bytes.data() + 13 + name.size(), tenant_salt.data(), tenant_salt.size());
  return to_chunk_hash(XXH3_128bits(bytes.data(), bytes.size()));
}

ChunkHash chain_hash(ChunkHash parent, std::span<const TokenId> block_tokens) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, &parent.low, sizeof(parent.low));
  XXH3_128bits_update(state, &parent.high, sizeof(parent.high));
  XXH3_128bits_update(state, block_tokens.data(), block_tokens.size_bytes());
  const ChunkHash h = to_chunk_hash(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return h;
}

}  // namespace strata::kv
