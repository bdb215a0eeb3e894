#include "redis_records.h"

#include <xxhash.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace strata::store::redis_records {
namespace {

constexpr char kMagic[4] = {'S', 'K', 'V', '1'};
constexpr std::string_view kSessionMagic = "strata-session 1";

bool parse_hex64(std::string_view s, uint64_t* out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return ec == std::errc() && end == s.data() + s.size() && s.size() == 16;
}

bool parse_hash(std::string_view s, kv::ChunkHash* out) {
  return s.size() == 32 && parse_hex64(s.substr(0, 16), &out->high) &&
         parse_hex64(s.substr(16), &out->low);
}

template <typename T>
void put_le(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(b, sizeof(T));
}

template <typename T>
T get_le(std::string_view in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

}  // namespace

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string hex_hash(const kv::ChunkHash& h) { return hex64(h.high) + hex64(h.low); }

std::string frame(const kv::ChunkHash& hash, std::span<const std::byte> payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size());
  out.append(kMagic, 4);
  put_le<uint32_t>(out, kHeaderBytes);
  put_le<uint64_t>(out, payload.size());
  put_le<uint64_t>(out, XXH3_64bits(payload.data(), payload.size()));
  put_le<uint64_t>(out, hash.low);
  put_le<uint64_t>(out, hash.high);
  out.append(reinterpret_cast<const char*>(payload.data()), payload.size());
  return out;
}

std::optional<std::string_view> unframe(std::string_view value, const kv::ChunkHash& hash) {
  if (value.size() < kHeaderBytes || std::memcmp(value.data(), kMagic, 4) != 0 ||
      get_le<uint32_t>(value, 4) != kHeaderBytes ||
      get_le<uint64_t>(value, 8) != value.size() - kHeaderBytes ||
      get_le<uint64_t>(value, 24) != hash.low || get_le<uint64_t>(value, 32) != hash.high) {
    return std::nullopt;
  }
  const std::string_view payload = value.substr(kHeaderBytes);
  if (XXH3_64bits(payload.data(), payload.size()) != get_le<uint64_t>(value, 16)) return std::nullopt;
  return payload;
}

std::string session_record(const ItemRecord& r, std::span<const kv::ChunkHash> hashes) {
  std::string text(kSessionMagic);
  text += "\nexact " + std::to_string(r.exact ? 1 : 0);
  text += "\noffset " + std::to_string(r.token_offset);
  text += "\ncodec " + (r.codec.empty() ? std::string("none") : r.codec);
  text += "\nchunks " + std::to_string(hashes.size());
  for (const kv::ChunkHash& h : hashes) text += "\n" + hex_hash(h);
  text += "\n";
  return text + "sum " + hex64(XXH3_64bits(text.data(), text.size()));
}

std::optional<RecoveredItem> parse_session_record(std::string_view text, const std::string& session) {
  const size_t sum_at = text.rfind("sum ");
  uint64_t sum = 0;
  if (sum_at == std::string_view::npos || !parse_hex64(text.substr(sum_at + 4), &sum) ||
      XXH3_64bits(text.data(), sum_at) != sum) {
    return std::nullopt;
  }
  std::istringstream in{std::string(text.substr(0, sum_at))};
  std::string line, word, codec;
  int exact = 0;
  int64_t offset = 0, n = 0;
  if (!std::getline(in, line) || line != kSessionMagic) return std::nullopt;
  if (!(in >> word >> exact) || word != "exact" || !(in >> word >> offset) || word != "offset" ||
      !(in >> word >> codec) || word != "codec" || !(in >> word >> n) || word != "chunks" ||
      n < 0 || offset < 0) {
    return std::nullopt;
  }
  RecoveredItem item;
  // Shared records carry no task family: another replica's item weighs the default quality.
  item.attributes = {.session = session,
                     .exact = exact == 1,
                     .token_offset = offset,
                     .codec = codec == "none" ? std::string() : codec,
                     .skipped_chunks = 0,
                     .task = {},
                     .layer_pairs = {},
                     .whole_chunks = 0};
  for (int64_t i = 0; i < n; ++i) {
    kv::ChunkHash h;
    if (!(in >> word) || !parse_hash(word, &h)) return std::nullopt;
    item.chunks.push_back({0, static_cast<int32_t>(i), h});
  }
  return item;
}

}  // namespace strata::store::redis_records
