// Chained content hashes of token blocks: the identity under which a full block's KV is cached.
//
//   root   = H(model_fingerprint, block format, block size, tenant salt)
//   hash_i = H(hash_{i-1}, tokens of block i)
//
// so equal hashes mean equal tokens from the start of the sequence, on the same model and format,
// for the same tenant: a stateless client that resends a history hits the same blocks as a session,
// and one tenant cannot probe another's prompts. H is XXH3-128.
#pragma once

#include <span>
#include <string_view>

#include "strata/common/ids.h"
#include "strata/kv/kv_types.h"

namespace strata::kv {

ChunkHash prefix_root(uint64_t model_fingerprint, KvFormat format, int32_t block_size_tokens,
                      std::string_view tenant_salt);
// The same with the format given by name: format_name() of one format (the overload above), or a
// sequence's per-layer layout spelled out (KvCacheManager).
ChunkHash prefix_root(uint64_t model_fingerprint, std::string_view format_name,
                      int32_t block_size_tokens, std::string_view tenant_salt);
ChunkHash chain_hash(ChunkHash parent, std::span<const TokenId> block_tokens);

}  // namespace strata::kv
