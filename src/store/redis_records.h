// The remote tier's records as they are stored in Redis (store/redis_tier.h has the key layout):
//   a chunk's value: [u8 x4 "SKV1"][u32 header bytes = 40][u64 payload bytes]
//                    [u64 XXH3-64 of the payload][u64 x2 the chunk hash], then the payload;
//   a session record: text lines "strata-session 1", "exact 0|1", "offset N", "codec NAME",
//                    "chunks N", N lines of 32 hex digits (chunk hashes), then "sum " and 16 hex
//                    digits of XXH3-64 over everything before it.
// Whatever Redis returns is untrusted (another process, or a corrupted value, wrote it): the
// parsers accept exactly these forms and nothing else (fuzzed: fuzz/redis_records_fuzz.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "strata/kv/kv_types.h"
#include "strata/store/tier.h"

namespace strata::store::redis_records {

inline constexpr uint32_t kHeaderBytes = 40;

std::string hex64(uint64_t v);                   // 16 lower-case hex digits
std::string hex_hash(const kv::ChunkHash& h);    // 32: high then low

// A chunk's value: the header, then `payload`.
std::string frame(const kv::ChunkHash& hash, std::span<const std::byte> payload);
// The payload of a value framed for `hash`; nullopt unless the magic, sizes, hash and checksum
// all hold.
std::optional<std::string_view> unframe(std::string_view value, const kv::ChunkHash& hash);

// The record of an item kept for a session: its attributes and chunk hashes in order.
std::string session_record(const ItemRecord& item, std::span<const kv::ChunkHash> hashes);
// The item a record describes (chunks 0..n-1, item ids unset; attributes.session = `session`),
// or nullopt for anything but a whole, well-formed record.
std::optional<RecoveredItem> parse_session_record(std::string_view text,
                                                  const std::string& session);

}  // namespace strata::store::redis_records
