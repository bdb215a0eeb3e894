// The remote tier's records on arbitrary bytes, as a corrupted or hostile Redis could return them
// (src/store/redis_records.h). Input: [u8 kind][16 bytes: the chunk hash the key names][the value].
// A chunk value is accepted only when framing its payload again for that hash gives the same
// bytes; a session record that parses is written back to one that parses to the same item. The
// seeds (a valid value and a valid record) are written by this binary: run with
// STRATA_FUZZ_WRITE_SEED=DIR (scripts/fuzz.sh does).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "store/redis_records.h"

namespace {

namespace records = strata::store::redis_records;
using strata::kv::ChunkHash;

bool same(const strata::store::RecoveredItem& a, const strata::store::RecoveredItem& b) {
  if (a.attributes.session != b.attributes.session || a.attributes.exact != b.attributes.exact ||
      a.attributes.token_offset != b.attributes.token_offset ||
      a.attributes.codec != b.attributes.codec || a.chunks.size() != b.chunks.size()) {
    return false;
  }
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    if (a.chunks[i].hash != b.chunks[i].hash || a.chunks[i].index != b.chunks[i].index) return false;
  }
  return true;
}

void write_seeds(const std::string& dir) {
  const ChunkHash hash{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  std::string header(1, '\0');
  header.append(reinterpret_cast<const char*>(&hash), sizeof(hash));
  const std::vector<std::byte> payload(64, std::byte{7});
  std::ofstream(dir + "/seed-value", std::ios::binary) << header + records::frame(hash, payload);
  header[0] = 1;
  const ChunkHash hashes[2] = {hash, {1, 2}};
  std::ofstream(dir + "/seed-session", std::ios::binary)
      << header + records::session_record({"s", false, 32, "kivi-4"}, hashes);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("STRATA_FUZZ_WRITE_SEED")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 + sizeof(ChunkHash)) return 0;
  ChunkHash hash;
  std::memcpy(&hash, data + 1, sizeof(hash));
  const std::string value(reinterpret_cast<const char*>(data) + 1 + sizeof(hash),
                          size - 1 - sizeof(hash));
  if (data[0] % 2 == 0) {
    if (std::optional<std::string_view> payload = records::unframe(value, hash)) {
      const auto* bytes = reinterpret_cast<const std::byte*>(payload->data());
      if (records::frame(hash, {bytes, payload->size()}) != value) std::abort();
    }
    return 0;
  }
  if (std::optional<strata::store::RecoveredItem> item = records::parse_session_record(value, "s")) {
    std::vector<ChunkHash> hashes;
    for (const auto& key : item->chunks) hashes.push_back(key.hash);
    const std::string again = records::session_record(item->attributes, hashes);
    const std::optional<strata::store::RecoveredItem> reparsed =
        records::parse_session_record(again, "s");
    if (!reparsed || !same(*item, *reparsed)) std::abort();
  }
  return 0;
}
