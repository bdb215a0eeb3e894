// The remote tier: chunks kept in a Redis server that several Strata replicas share, so that a
// conversation whose next turn lands on another replica loads its history instead of computing
// it (docs/kv-store.md, "Remote tier"). Redis is the store; this is a client of it.
//
// Keys, all under "strata:1:<layout tag, 16 hex>:<tier codec>:" (the layout tag names the model's
// content, the pool's K and V formats, the block size and the chunk size, so replicas of another
// model or format never meet; the tenant is in the chained hashes):
//   k:<item codec>:<hash, 32 hex>              a chunk of an exact item (found by content)
//   t:<session>:<item codec>:<index>:<hash>    a chunk of a truncated item (found by session)
//   s:<session>                                the session's latest item: a text record of its
//                                              attributes and chunk hashes, with an XXH3-64
// <session> is the store's session key (an XXH3-128 digest of the tenant-qualified session id).
// A chunk's value is a 40-byte header, then its bytes after the tier codec:
//   [u8 x4 "SKV1"][u32 header bytes = 40][u64 payload bytes][u64 XXH3-64 of the payload]
//   [u64 x2 the chunk hash]
// Every read checks the header, the hash the key names and the checksum; a value that fails is
// deleted and the read is DATA_LOSS (the store drops the item and the turn recomputes).
//
// Values are written with a TTL (PX) that each read renews; the server's maxmemory policy decides
// what goes when it is full (allkeys-lru for a cache; with noeviction a full server refuses
// writes, counted as "full"). evict() forgets this process's index entries only: other replicas
// may still read the values. capacity_bytes bounds what this process indexes; items larger than
// max_item_bytes are not written.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "strata/store/tier.h"

namespace strata::store {

class RedisClient;

struct RedisOptions {
  std::string name = "remote";
  std::string address;   // host:port or unix:/path
  std::string username;  // ACL user; empty: the default user
  // The environment variable holding the password (AUTH); empty: no AUTH.
  std::string password_env;
  int32_t database = 0;
  int64_t capacity_bytes = 0;
  int64_t max_item_bytes = int64_t{256} << 20;
  std::chrono::milliseconds timeout{200};       // connect and each socket read or write
  std::chrono::milliseconds retry_after{1000};  // calls refused after a failure
  std::chrono::seconds ttl{3600};               // of every key, renewed by reads; 0: none
  uint64_t layout_tag = 0;                      // set by the store
  CodecKind codec = CodecKind::kIdentity;
};

class RedisTier final : public SharedTier {
 public:
  // INVALID_ARGUMENT for a malformed address; FAILED_PRECONDITION when password_env names an
  // unset variable. Does not connect: a server that is down makes the tier unavailable until it
  // answers.
  static StatusOr<std::unique_ptr<RedisTier>> open(const RedisOptions& options);
  ~RedisTier() override;
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  const std::string& name() const override { return options_.name; }
  CodecKind codec() const override { return options_.codec; }
  int64_t capacity_bytes() const override { return options_.capacity_bytes; }
  int64_t used_bytes() const override;
  int64_t footprint(int64_t bytes) const override;
  bool available() const override;  // false during the back-off after a failure
  bool healthy() const override;     // false from a failed call until a call succeeds
  std::optional<Reservation> reserve(std::span<const int64_t> sizes) override;
  void cancel(const Reservation& reservation) override;
  Status put(const ItemRecord& item, const Reservation& reservation, std::span<const ChunkKey> keys,
             std::span<const std::span<const std::byte>> values) override;
  Status get(ItemId item, std::span<const int32_t> indices,
             std::span<AlignedBuffer> out) const override;
  bool contains(const ChunkKey& key) const override;
  Status evict(ItemId item) override;
  std::map<std::string, int64_t> failures() const override;

  StatusOr<std::optional<RecoveredItem>> find_session(const std::string& session) override;
  StatusOr<int64_t> count_held(std::span<const kv::ChunkHash> chain) override;
  void attach(const RecoveredItem& found) override;
  Status erase_session(const std::string& session) override;

  // The key of a chunk (tests corrupt values through it).
  std::string chunk_key(const ItemRecord& item, const ChunkKey& key) const;

 private:
  struct Indexed {
    ItemRecord record;
    std::vector<kv::ChunkHash> hashes;  // chunk i's hash; the tier holds chunks 0..n-1
    int64_t bytes = 0;                  // of values this process wrote or read
  };
  RedisTier(const RedisOptions& options, std::unique_ptr<RedisClient> client);
  std::string session_key(const std::string& session) const;
  // SET key value, with the TTL when there is one (views into the arguments).
  std::vector<std::string_view> set_command(const std::string& key, const std::string& value) const;
  void count(const std::string& reason) const;

  RedisOptions options_;
  std::string prefix_;
  std::string ttl_ms_;  // PX argument
  std::unique_ptr<RedisClient> client_;
  mutable std::mutex mutex_;
  std::unordered_map<ItemId, Indexed> items_;
  int64_t used_ = 0;  // indexed bytes plus reservations
  mutable std::map<std::string, int64_t> rejected_;  // values refused or found bad, by reason
};

}  // namespace strata::store
