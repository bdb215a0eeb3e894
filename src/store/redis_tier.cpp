#include "strata/store/redis_tier.h"

#include <cstring>

#include "redis_records.h"
#include "strata/store/redis_client.h"

namespace strata::store {
namespace {

using redis_records::frame;
using redis_records::hex64;
using redis_records::hex_hash;
using redis_records::kHeaderBytes;
using redis_records::parse_session_record;
using redis_records::session_record;
using redis_records::unframe;

std::string reason_of_error(const std::string& text) {
  return text.starts_with("OOM") ? "full" : "error";
}

}  // namespace

StatusOr<std::unique_ptr<RedisTier>> RedisTier::open(const RedisOptions& options) {
  if (options.capacity_bytes <= 0) {
    return invalid_argument_error("store." + options.name + ": capacity must be positive");
  }
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<RedisClient> client,
      RedisClient::create({options.address, options.username, options.password_env,
                           options.database, options.timeout, options.retry_after}));
  return std::unique_ptr<RedisTier>(new RedisTier(options, std::move(client)));
}

RedisTier::RedisTier(const RedisOptions& options, std::unique_ptr<RedisClient> client)
    : options_(options),
      prefix_("strata:1:" + hex64(options.layout_tag) + ":" + codec_name(options.codec) + ":"),
      ttl_ms_(std::to_string(std::chrono::milliseconds(options.ttl).count())),
      client_(std::move(client)) {}

RedisTier::~RedisTier() = default;

int64_t RedisTier::used_bytes() const {
  std::scoped_lock lock(mutex_);
  return used_;
}

int64_t RedisTier::footprint(int64_t bytes) const { return bytes + kHeaderBytes; }

bool RedisTier::available() const { return client_->available(); }

bool RedisTier::healthy() const { return client_->reachable(); }

std::map<std::string, int64_t> RedisTier::failures() const {
  std::map<std::string, int64_t> out = client_->failures();
  std::scoped_lock lock(mutex_);
  for (const auto& [reason, n] : rejected_) out[reason] += n;
  return out;
}

void RedisTier::count(const std::string& reason) const {
  std::scoped_lock lock(mutex_);
  ++rejected_[reason];
}

std::string RedisTier::chunk_key(const ItemRecord& item, const ChunkKey& key) const {
  const std::string codec = item.codec.empty() ? "none" : item.codec;
  if (item.exact) return prefix_ + "k:" + codec + ":" + hex_hash(key.hash);
  return prefix_ + "t:" + item.session + ":" + codec + ":" + std::to_string(key.index) + ":" +
         hex_hash(key.hash);
}

RedisCommand RedisTier::set_command(const std::string& key, const std::string& value) const {
  if (options_.ttl.count() > 0) return {"SET", key, value, "PX", ttl_ms_};
  return {"SET", key, value};
}

std::string RedisTier::session_key(const std::string& session) const {
  return prefix_ + "s:" + session;
}

std::optional<Reservation> RedisTier::reserve(std::span<const int64_t> sizes) {
  int64_t total = 0;
  Reservation r;
  for (int64_t s : sizes) {
    total += footprint(s);
    r.placements.push_back({{}, s});
  }
  std::scoped_lock lock(mutex_);
  if (total > options_.max_item_bytes) {
    ++rejected_["too_large"];
    return std::nullopt;
  }
  if (used_ + total > options_.capacity_bytes) return std::nullopt;
  used_ += total;
  return r;
}

void RedisTier::cancel(const Reservation& reservation) {
  int64_t total = 0;
  for (const Placement& p : reservation.placements) total += footprint(p.bytes);
  std::scoped_lock lock(mutex_);
  used_ -= total;
}

Status RedisTier::put(const ItemRecord& item, const Reservation& reservation,
                      std::span<const ChunkKey> keys,
                      std::span<const std::span<const std::byte>> values) {
  if (keys.empty()) return Status();
  std::vector<std::string> names, framed;
  for (size_t i = 0; i < keys.size(); ++i) {
    names.push_back(chunk_key(item, keys[i]));
    framed.push_back(frame(keys[i].hash, values[i]));
  }
  std::vector<RedisCommand> commands;
  for (size_t i = 0; i < keys.size(); ++i) commands.push_back(set_command(names[i], framed[i]));
  // The session's record names every chunk this item has here, once they are all written.
  std::string record;
  const std::string skey = session_key(item.session);
  if (!item.session.empty()) {
    std::scoped_lock lock(mutex_);
    std::vector<kv::ChunkHash> hashes;
    if (auto it = items_.find(keys.front().item); it != items_.end()) hashes = it->second.hashes;
    bool whole = true;
    for (const ChunkKey& k : keys) {
      if (k.index > std::ssize(hashes)) whole = false;
      if (k.index >= std::ssize(hashes)) hashes.resize(k.index + 1);
      hashes[k.index] = k.hash;
    }
    if (whole) {
      record = session_record(item, hashes);
      commands.push_back(set_command(skey, record));
    }
  }
  StatusOr<std::vector<RedisReply>> replies = client_->run(commands);
  Status status = replies.status();
  for (size_t i = 0; status.ok() && i < replies->size(); ++i) {
    const RedisReply& r = (*replies)[i];
    if (r.type == RedisReply::Type::kError) {
      const std::string reason = reason_of_error(r.text);
      count(reason);
      status = Status(reason == "full" ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                      "redis refused a KV chunk: " + r.text);
    }
  }
  if (!status.ok()) {
    cancel(reservation);
    return status;
  }
  std::scoped_lock lock(mutex_);
  Indexed& indexed = items_[keys.front().item];
  indexed.record = item;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].index >= std::ssize(indexed.hashes)) indexed.hashes.resize(keys[i].index + 1);
    indexed.hashes[keys[i].index] = keys[i].hash;
    indexed.bytes += footprint(reservation.placements[i].bytes);
  }
  return Status();
}

Status RedisTier::get(ItemId item, std::span<const int32_t> indices,
                      std::span<AlignedBuffer> out) const {
  ItemRecord record;
  std::vector<ChunkKey> keys;
  {
    std::scoped_lock lock(mutex_);
    auto it = items_.find(item);
    if (it == items_.end()) return not_found_error("remote tier: item not indexed");
    record = it->second.record;
    for (int32_t i : indices) {
      if (i >= std::ssize(it->second.hashes)) return not_found_error("remote tier: chunk not indexed");
      keys.push_back({item, i, it->second.hashes[i], 0});
    }
  }
  std::vector<std::string> names;
  for (const ChunkKey& k : keys) names.push_back(chunk_key(record, k));
  std::vector<RedisCommand> commands;
  for (const std::string& name : names) {
    commands.push_back({"GET", name});
    if (options_.ttl.count() > 0) commands.push_back({"PEXPIRE", name, ttl_ms_});
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<RedisReply> replies, client_->run(commands));
  const size_t stride = options_.ttl.count() > 0 ? 2 : 1;
  for (size_t i = 0; i < keys.size(); ++i) {
    const RedisReply& r = replies[i * stride];
    if (r.type == RedisReply::Type::kNil) {
      count("missing");
      return not_found_error("remote tier: chunk " + std::to_string(keys[i].index) +
                             " expired or was evicted by the server");
    }
    std::optional<std::string_view> payload;
    if (r.type == RedisReply::Type::kString) payload = unframe(r.text, keys[i].hash);
    if (!payload) {
      count("corrupt");
      const std::vector<RedisCommand> drop = {{"DEL", names[i]}};
      (void)client_->run(drop);  // nobody reads it again
      return Status(StatusCode::kDataLoss, "remote tier: chunk " + std::to_string(keys[i].index) +
                                               " failed its checksum (deleted)");
    }
    out[i] = AlignedBuffer(std::ssize(*payload));
    std::memcpy(out[i].data(), payload->data(), payload->size());
  }
  return Status();
}

bool RedisTier::contains(const ChunkKey& key) const {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(key.item);
  return it != items_.end() && key.index < std::ssize(it->second.hashes) &&
         it->second.hashes[key.index] == key.hash;
}

Status RedisTier::evict(ItemId item) {
  std::scoped_lock lock(mutex_);
  auto it = items_.find(item);
  if (it == items_.end()) return Status();
  used_ -= it->second.bytes;
  items_.erase(it);
  return Status();
}

StatusOr<std::optional<RecoveredItem>> RedisTier::find_session(const std::string& session) {
  const std::string key = session_key(session);
  std::vector<RedisCommand> commands = {{"GET", key}};
  STRATA_ASSIGN_OR_RETURN(std::vector<RedisReply> replies, client_->run(commands));
  if (replies[0].type != RedisReply::Type::kString) return std::optional<RecoveredItem>();
  std::optional<RecoveredItem> found = parse_session_record(replies[0].text, session);
  if (!found) {
    count("corrupt");
    const std::vector<RedisCommand> drop = {{"DEL", key}};
    (void)client_->run(drop);
  }
  return found;
}

StatusOr<int64_t> RedisTier::count_held(std::span<const kv::ChunkHash> chain) {
  if (chain.empty()) return 0;
  const ItemRecord exact;  // an exact item without a lossy codec
  std::vector<std::string> names;
  for (size_t i = 0; i < chain.size(); ++i) {
    names.push_back(chunk_key(exact, {0, static_cast<int32_t>(i), chain[i]}));
  }
  std::vector<RedisCommand> commands;
  for (const std::string& name : names) commands.push_back({"EXISTS", name});
  STRATA_ASSIGN_OR_RETURN(std::vector<RedisReply> replies, client_->run(commands));
  int64_t n = 0;
  while (n < std::ssize(replies) && replies[n].type == RedisReply::Type::kInteger &&
         replies[n].integer == 1) {
    ++n;
  }
  return n;
}

void RedisTier::attach(const RecoveredItem& found) {
  std::scoped_lock lock(mutex_);
  Indexed& indexed = items_[found.id];
  indexed.record = found.attributes;
  indexed.hashes.clear();
  for (const ChunkKey& k : found.chunks) indexed.hashes.push_back(k.hash);
}

Status RedisTier::erase_session(const std::string& session) {
  const std::string key = session_key(session);
  const std::vector<RedisCommand> commands = {{"DEL", key}};
  return client_->run(commands).status();
}

}  // namespace strata::store
