#include "strata/store/ssd_tier.h"

#include <xxhash.h>

#include <cstring>
#include <spdlog/spdlog.h>

#include "strata/common/check.h"

namespace strata::store {
namespace {

constexpr uint64_t kMagic = 0x564b415441525453ULL;  // "STRATAKV"
// 2: variable-size values in extents, a codec; 3: item codecs, records with a sync word;
// 4: items' skipped chunks (token dropping); 5: items' task family; 6: items' layer pairs (Krul);
// 7: a checksum per segment of a value (partial reads); 8: items' whole chunks (H2O); 9: a
// value's first layer (Krul's stored suffix).
constexpr uint32_t kVersion = 9;
constexpr uint32_t kSync = 0x4b565453;  // "STVK": where a record starts
enum RecordType : uint32_t { kHeader = 1, kPut = 2, kDrop = 3 };
// [u32 sync][u32 payload bytes][u32 type] payload [u64 XXH3-64 of size, type and payload]
constexpr size_t kFrame = 3 * sizeof(uint32_t), kSum = sizeof(uint64_t);
constexpr uint32_t kMaxPayload = 1 << 20;
constexpr uint32_t kMaxSegments = 4096;

// A value's checksums: one per segment of segment_bytes, the last one shorter (a part of the
// value can be read and checked alone), at most kMaxSegments of them, else one over the whole
// value. Segments of a value of `bytes` with `count` checksums are segment_of(bytes, count) bytes
// (for count = ceil(bytes / s) with s <= bytes that is at most s and gives count segments again).
int64_t segment_of(int64_t bytes, int64_t count) { return (bytes + count - 1) / count; }

std::vector<uint64_t> checksums_of(std::span<const std::byte> value, int64_t segment_bytes) {
  const auto bytes = static_cast<int64_t>(value.size());
  int64_t segments = 1;
  if (segment_bytes > 0 && (bytes + segment_bytes - 1) / segment_bytes <= kMaxSegments) {
    segments = std::max<int64_t>((bytes + segment_bytes - 1) / segment_bytes, 1);
  }
  const int64_t each = segment_of(bytes, segments);
  std::vector<uint64_t> sums;
  for (int64_t at = 0; at < bytes || sums.empty(); at += each) {
    sums.push_back(XXH3_64bits(value.data() + at, static_cast<size_t>(std::min(each, bytes - at))));
  }
  return sums;
}

// Whether `part` (bytes [offset, offset + part.size()) of a value of `bytes` bytes) matches the
// checksums of the segments it covers; false also when it does not cover whole segments.
bool part_matches(std::span<const std::byte> part, int64_t offset, int64_t bytes,
                  std::span<const uint64_t> checksums) {
  const int64_t each = segment_of(bytes, std::ssize(checksums));
  const auto size = static_cast<int64_t>(part.size());
  if (each == 0 || offset % each != 0 || (size % each != 0 && offset + size != bytes)) {
    return false;
  }
  for (int64_t done = 0; done < size; done += each) {
    if (XXH3_64bits(part.data() + done, static_cast<size_t>(std::min(each, size - done))) !=
        checksums[(offset + done) / each]) {
      return false;
    }
  }
  return true;
}

class Writer {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    payload_.insert(payload_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint16_t>(static_cast<uint16_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    payload_.insert(payload_.end(), p, p + s.size());
  }
  // Frames the payload as one record and appends it to `out`.
  void finish(RecordType type, std::vector<std::byte>& out) {
    Writer frame;
    frame.put<uint32_t>(kSync);
    frame.put<uint32_t>(static_cast<uint32_t>(payload_.size()));
    frame.put<uint32_t>(type);
    const size_t start = out.size();
    out.insert(out.end(), frame.payload_.begin(), frame.payload_.end());
    out.insert(out.end(), payload_.begin(), payload_.end());
    const uint64_t sum = XXH3_64bits(out.data() + start + sizeof(uint32_t),
                                     out.size() - start - sizeof(uint32_t));
    const auto* p = reinterpret_cast<const std::byte*>(&sum);
    out.insert(out.end(), p, p + sizeof(sum));
    payload_.clear();
  }

 private:
  std::vector<std::byte> payload_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> data) : data_(data) {}
  template <typename T>
  bool get(T* v) {
    if (pos_ + sizeof(T) > data_.size()) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_string(std::string* s) {
    uint16_t n = 0;
    if (!get(&n) || pos_ + n > data_.size()) return false;
    s->assign(reinterpret_cast<const char*>(data_.data() + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  std::span<const std::byte> data_;
  size_t pos_ = 0;
};

void encode_header(const SsdOptions& o, int64_t file_bytes, std::vector<std::byte>& out) {
  Writer w;
  w.put<uint64_t>(kMagic);
  w.put<uint32_t>(kVersion);
  w.put<int64_t>(kIoAlignment);
  w.put<int64_t>(file_bytes);
  w.put<uint64_t>(o.layout_tag);
  w.put<uint8_t>(static_cast<uint8_t>(o.codec));
  w.finish(kHeader, out);
}

struct PutRecord {
  int64_t seq = 0;  // its place in the journal (replay only)
  ChunkKey key;
  Placement placement;
  std::vector<uint64_t> checksums;  // checksums_of(the value)
  ItemRecord item;
};

void encode_put(const PutRecord& r, std::vector<std::byte>& out) {
  Writer w;
  w.put<uint64_t>(r.key.item);
  w.put<int32_t>(r.key.index);
  w.put<uint64_t>(r.key.hash.low);
  w.put<uint64_t>(r.key.hash.high);
  w.put<int64_t>(r.placement.bytes);
  w.put<uint32_t>(static_cast<uint32_t>(r.checksums.size()));
  for (const uint64_t sum : r.checksums) w.put<uint64_t>(sum);
  w.put<uint32_t>(static_cast<uint32_t>(r.placement.extents.size()));
  for (const Extent& e : r.placement.extents) {
    w.put<int64_t>(e.start);
    w.put<int64_t>(e.length);
  }
  w.put<uint8_t>(r.item.exact ? 1 : 0);
  w.put<int64_t>(r.item.token_offset);
  w.put_string(r.item.session);
  w.put_string(r.item.codec);
  w.put<int64_t>(r.item.skipped_chunks);
  w.put_string(r.item.task);
  w.put<uint32_t>(static_cast<uint32_t>(r.item.layer_pairs.size()));
  for (const kv::krul::LayerPair& pair : r.item.layer_pairs) {
    w.put<int32_t>(pair.shallow);
    w.put<int32_t>(pair.deep);
  }
  w.put<int64_t>(r.item.whole_chunks);
  w.put<int32_t>(r.key.first_layer);
  w.finish(kPut, out);
}

bool decode_put(Reader& p, PutRecord* r) {
  uint32_t extents = 0, segments = 0;
  uint8_t exact = 0;
  if (!(p.get(&r->key.item) && p.get(&r->key.index) && p.get(&r->key.hash.low) &&
        p.get(&r->key.hash.high) && p.get(&r->placement.bytes) && r->placement.bytes > 0 &&
        p.get(&segments) && segments >= 1 && segments <= kMaxSegments &&
        segments <= r->placement.bytes &&
        (r->placement.bytes + segment_of(r->placement.bytes, segments) - 1) /
                segment_of(r->placement.bytes, segments) ==
            segments)) {
    return false;
  }
  r->checksums.resize(segments);
  for (uint64_t& sum : r->checksums) {
    if (!p.get(&sum)) return false;
  }
  if (!p.get(&extents) || extents > 4096) return false;
  for (uint32_t i = 0; i < extents; ++i) {
    Extent e;
    if (!p.get(&e.start) || !p.get(&e.length)) return false;
    r->placement.extents.push_back(e);
  }
  if (!(p.get(&exact) && p.get(&r->item.token_offset) && p.get_string(&r->item.session) &&
        p.get_string(&r->item.codec) && p.get(&r->item.skipped_chunks) &&
        r->item.skipped_chunks >= 0 && p.get_string(&r->item.task))) {
    return false;
  }
  uint32_t pairs = 0;
  if (!p.get(&pairs) || pairs > 4096) return false;
  for (uint32_t i = 0; i < pairs; ++i) {
    kv::krul::LayerPair& pair = r->item.layer_pairs.emplace_back();
    if (!p.get(&pair.shallow) || !p.get(&pair.deep) || pair.shallow < 0 ||
        pair.deep <= pair.shallow) {
      return false;
    }
  }
  if (!p.get(&r->item.whole_chunks) || r->item.whole_chunks < 0) return false;
  if (!p.get(&r->key.first_layer) || r->key.first_layer < 0) return false;
  r->item.exact = exact != 0;
  return true;
}

}  // namespace

SsdTier::SsdTier(const SsdOptions& options, std::vector<Extent> regions)
    : options_(options), allocator_(regions) {}

SsdTier::~SsdTier() = default;

std::string SsdTier::data_path(int64_t file) const {
  char name[32];
  std::snprintf(name, sizeof(name), "data-%03lld.bin", static_cast<long long>(file));
  return options_.dir + "/" + name;
}

std::string SsdTier::journal_path() const { return options_.dir + "/index.journal"; }

StatusOr<std::unique_ptr<SsdTier>> SsdTier::open(const SsdOptions& options,
                                                 std::vector<RecoveredItem>* recovered) {
  const int64_t pages_per_file = options.file_bytes / kIoAlignment;
  if (pages_per_file <= 0) {
    return invalid_argument_error("store.ssd_file_bytes must be at least one page (4096 bytes)");
  }
  SsdOptions opened = options;
  std::unique_ptr<Env> throttled;
  if (options.bandwidth_limit > 0) {
    throttled = throttled_env(options.env, options.bandwidth_limit);
    opened.env = throttled.get();
  }
  Env& env = *opened.env;
  STRATA_RETURN_IF_ERROR(env.create_dir(options.dir));
  // Data files: as many as the capacity asks for and the disk holds.
  const int64_t total_pages = options.capacity_bytes / kIoAlignment;
  const int64_t wanted_files = (total_pages + pages_per_file - 1) / pages_per_file;
  std::vector<std::unique_ptr<File>> files;
  std::vector<Extent> regions;
  bool direct = options.direct_io;
  for (int64_t f = 0; f < wanted_files; ++f) {
    const int64_t pages = std::min(pages_per_file, total_pages - f * pages_per_file);
    char name[32];
    std::snprintf(name, sizeof(name), "/data-%03lld.bin", static_cast<long long>(f));
    const std::string path = options.dir + name;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env.open(path, OpenMode::kReadWrite, direct));
    if (direct && !file->direct_io()) {
      spdlog::warn("{}: the file system does not support O_DIRECT; using buffered I/O", path);
      direct = false;
    }
    if (Status reserved = file->allocate(pages * kIoAlignment); !reserved.ok()) {
      file.reset();
      (void)env.remove(path);
      spdlog::warn("{}; the SSD tier keeps {} of {} files", reserved.message(), f, wanted_files);
      break;
    }
    files.push_back(std::move(file));
    regions.push_back({f * pages_per_file, pages});
  }
  if (files.empty()) {
    return resource_exhausted_error(options.dir + ": no room for even one SSD tier file");
  }
  std::unique_ptr<SsdTier> tier(new SsdTier(opened, regions));
  tier->throttled_env_ = std::move(throttled);
  tier->files_ = std::move(files);
  tier->pages_per_file_ = pages_per_file;
  tier->direct_io_ = direct;
  STRATA_RETURN_IF_ERROR(tier->recover(recovered));
  return tier;
}

Status SsdTier::recover(std::vector<RecoveredItem>* recovered) {
  recovered->clear();
  Env& env = *options_.env;
  const std::string path = journal_path();
  std::vector<std::byte> data;
  if (Status read = env.read_file(path, &data); !read.ok() && read.code() != StatusCode::kNotFound) {
    spdlog::warn("{}; the SSD tier starts empty", read.message());
    data.clear();
  }
  struct Pending {
    ItemRecord attributes;
    std::map<int32_t, PutRecord> chunks;
  };
  std::map<ItemId, Pending> items;
  bool header_ok = false;
  int64_t good_records = 0, skipped_bytes = 0;
  int64_t seq = 0;  // of each good record, in journal order
  size_t pos = 0;
  // The record at `at` if it is whole and its checksum matches: its size, type and payload.
  auto record_at = [&](size_t at, uint32_t* type, std::span<const std::byte>* payload) {
    Reader frame(std::span<const std::byte>(data).subspan(at));
    uint32_t sync = 0, size = 0;
    if (!frame.get(&sync) || !frame.get(&size) || !frame.get(type) || sync != kSync ||
        size > kMaxPayload || at + kFrame + size + kSum > data.size()) {
      return false;
    }
    uint64_t sum = 0;
    std::memcpy(&sum, data.data() + at + kFrame + size, kSum);
    const std::byte* checked = data.data() + at + sizeof(uint32_t);
    if (sum != XXH3_64bits(checked, kFrame - sizeof(uint32_t) + size)) return false;
    *payload = std::span<const std::byte>(data.data() + at + kFrame, size);
    return true;
  };
  while (pos < data.size()) {
    uint32_t type = 0;
    std::span<const std::byte> payload;
    if (!record_at(pos, &type, &payload)) {
      // A corrupt or torn record: skip to the next place a whole record starts, keeping every
      // good record after it.
      const size_t from = pos;
      for (++pos; pos < data.size() && !record_at(pos, &type, &payload); ++pos) {
      }
      skipped_bytes += static_cast<int64_t>(pos - from);
      continue;
    }
    pos += kFrame + payload.size() + kSum;
    ++seq;
    Reader p(payload);
    if (type == kHeader && header_ok) continue;  // the copy compaction writes after the first
    if (!header_ok) {
      uint64_t magic = 0, tag = 0;
      uint32_t version = 0;
      int64_t page_bytes = 0, file_bytes = 0;
      uint8_t codec = 0;
      header_ok = type == kHeader && p.get(&magic) && p.get(&version) && p.get(&page_bytes) &&
                  p.get(&file_bytes) && p.get(&tag) && p.get(&codec) && magic == kMagic &&
                  version == kVersion && page_bytes == kIoAlignment &&
                  file_bytes == pages_per_file_ * kIoAlignment && tag == options_.layout_tag &&
                  codec == static_cast<uint8_t>(options_.codec);
      if (!header_ok && type == kHeader) {
        spdlog::warn(
            "{}: written for another model, layout, codec or journal version; the SSD tier "
            "starts empty",
            path);
        break;
      }
      if (!header_ok) continue;  // records before any good header cannot be trusted
    } else if (type == kPut) {
      PutRecord r;
      if (!decode_put(p, &r)) continue;
      r.seq = seq;
      Pending& pending = items[r.key.item];
      pending.attributes = r.item;
      pending.chunks[r.key.index] = std::move(r);
    } else if (type == kDrop) {
      ItemId id = 0;
      if (p.get(&id)) items.erase(id);
    }
    ++good_records;
  }
  if (skipped_bytes > 0) {
    spdlog::warn("{}: skipped {} bytes of torn or corrupt records; kept {} good records", path,
                 skipped_bytes, good_records);
  }

  // A page two surviving PUTs name (the DROP between them was lost) belongs to the later one.
  std::map<int64_t, int64_t> owner;  // page -> seq of the newest PUT naming it
  for (const auto& [id, pending] : items) {
    for (const auto& [index, r] : pending.chunks) {
      for (const Extent& e : r.placement.extents) {
        for (int64_t page = e.start; page < e.start + e.length; ++page) {
          int64_t& o = owner[page];
          o = std::max(o, r.seq);
        }
      }
    }
  }
  auto owns = [&](const PutRecord& r) {
    for (const Extent& e : r.placement.extents) {
      for (int64_t page = e.start; page < e.start + e.length; ++page) {
        if (owner[page] != r.seq) return false;
      }
    }
    return true;
  };
  // Rebuild: each item keeps its chunks 0..k-1 whose extents exist and are its own.
  int64_t dropped_chunks = 0;
  std::vector<std::byte> out;
  // Twice: a corrupt first header still leaves one to check the rest against.
  encode_header(options_, pages_per_file_ * kIoAlignment, out);
  encode_header(options_, pages_per_file_ * kIoAlignment, out);
  for (auto& [id, pending] : items) {
    RecoveredItem item{id, pending.attributes, {}};
    for (auto& [index, r] : pending.chunks) {
      bool ok = index == std::ssize(item.chunks) && !r.placement.extents.empty() && owns(r);
      size_t marked = 0;
      for (; ok && marked < r.placement.extents.size(); ++marked) {
        ok = allocator_.mark_used(r.placement.extents[marked]);
      }
      if (!ok) {
        for (size_t i = 0; i + 1 < marked; ++i) allocator_.free(r.placement.extents[i]);
        break;
      }
      item.chunks.push_back(r.key);
      values_[id][index] = {r.key.hash, r.placement, r.checksums};
      encode_put(r, out);
    }
    dropped_chunks += std::ssize(pending.chunks) - std::ssize(item.chunks);
    if (!item.chunks.empty()) recovered->push_back(std::move(item));
  }
  if (dropped_chunks > 0) {
    spdlog::warn("{}: dropped {} chunks that were out of range or out of order", path, dropped_chunks);
  }
  // Compact: a fresh journal with the header and one PUT per surviving chunk, swapped in atomically.
  const std::string tmp = path + ".tmp";
  {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env.open(tmp, OpenMode::kTruncate, false));
    STRATA_RETURN_IF_ERROR(file->append(out));
    STRATA_RETURN_IF_ERROR(file->sync());
  }
  STRATA_RETURN_IF_ERROR(env.rename(tmp, path));
  STRATA_RETURN_IF_ERROR(env.sync_dir(options_.dir));
  STRATA_ASSIGN_OR_RETURN(journal_, env.open(path, OpenMode::kAppend, false));
  return Status();
}

int64_t SsdTier::capacity_bytes() const {
  std::scoped_lock lock(mutex_);
  return allocator_.num_slots() * kIoAlignment;
}

int64_t SsdTier::used_bytes() const {
  std::scoped_lock lock(mutex_);
  return (allocator_.num_slots() - allocator_.num_free()) * kIoAlignment;
}

bool SsdTier::available() const {
  std::scoped_lock lock(mutex_);
  return !failed_;
}

Status SsdTier::fail(Status status) const {
  std::scoped_lock lock(mutex_);
  if (!failed_) {
    spdlog::warn("KV store: the {} tier failed ({}); continuing without it", options_.name,
                 status.to_string());
  }
  failed_ = true;
  return Status(StatusCode::kUnavailable, status.message());
}

std::optional<Reservation> SsdTier::reserve(std::span<const int64_t> sizes) {
  std::scoped_lock lock(mutex_);
  if (failed_) return std::nullopt;
  int64_t pages = 0;
  for (int64_t bytes : sizes) pages += footprint(bytes) / kIoAlignment;
  if (pages > allocator_.num_free()) return std::nullopt;
  Reservation r;
  for (int64_t bytes : sizes) {
    r.placements.push_back({allocator_.allocate(footprint(bytes) / kIoAlignment).value(), bytes});
  }
  return r;
}

void SsdTier::cancel(const Reservation& reservation) {
  std::scoped_lock lock(mutex_);
  for (const Placement& p : reservation.placements) {
    for (const Extent& e : p.extents) allocator_.free(e);
  }
}

Status SsdTier::put(const ItemRecord& item, const Reservation& reservation,
                    std::span<const ChunkKey> keys,
                    std::span<const std::span<const std::byte>> values) {
  STRATA_CHECK_EQ(keys.size(), reservation.placements.size());
  STRATA_CHECK_EQ(values.size(), keys.size());
  std::vector<PutRecord> records;
  std::vector<int64_t> touched;
  Status status;
  for (size_t i = 0; i < keys.size() && status.ok(); ++i) {
    const Placement& p = reservation.placements[i];
    records.push_back({0, keys[i], p, checksums_of(values[i], options_.segment_bytes), item});
    // The value's pages, extent by extent (the source is readable up to its footprint).
    int64_t done = 0;
    for (const Extent& e : p.extents) {
      const int64_t file = e.start / pages_per_file_;
      const int64_t bytes = e.length * kIoAlignment;
      status = files_[file]->write_at((e.start % pages_per_file_) * kIoAlignment,
                                      {values[i].data() + done, static_cast<size_t>(bytes)});
      if (!status.ok()) break;
      done += bytes;
      if (std::find(touched.begin(), touched.end(), file) == touched.end()) touched.push_back(file);
    }
  }
  for (size_t f = 0; f < touched.size() && status.ok(); ++f) status = files_[touched[f]]->sync();
  if (status.ok()) {
    std::vector<std::byte> out;
    for (const PutRecord& r : records) encode_put(r, out);
    status = append(out);
  }
  if (!status.ok()) {
    cancel(reservation);
    return fail(status);
  }
  std::scoped_lock lock(mutex_);
  for (const PutRecord& r : records) {
    values_[r.key.item][r.key.index] = {r.key.hash, r.placement, r.checksums};
  }
  return Status();
}

StatusOr<SsdTier::Value> SsdTier::find(ItemId item, int32_t index) const {
  std::scoped_lock lock(mutex_);
  if (failed_) return Status(StatusCode::kUnavailable, options_.name + " tier failed");
  auto it = values_.find(item);
  if (it != values_.end()) {
    if (auto v = it->second.find(index); v != it->second.end()) return v->second;
  }
  return not_found_error(options_.name + ": chunk " + std::to_string(index) + " of item " +
                         std::to_string(item) + " is not held");
}

Status SsdTier::read_pages(const Placement& placement, int64_t first, int64_t count,
                           std::byte* out) const {
  int64_t page = 0;  // of the value, where extent e starts
  for (const Extent& e : placement.extents) {
    const int64_t from = std::max(first, page), to = std::min(first + count, page + e.length);
    if (from < to) {
      const int64_t at = e.start + (from - page);
      Status read = files_[at / pages_per_file_]->read_at(
          (at % pages_per_file_) * kIoAlignment,
          {out + (from - first) * kIoAlignment, static_cast<size_t>((to - from) * kIoAlignment)});
      if (!read.ok()) return fail(read);
    }
    page += e.length;
  }
  return Status();
}

Status SsdTier::get(ItemId item, std::span<const int32_t> indices,
                    std::span<AlignedBuffer> out) const {
  std::vector<Value> wanted;
  for (int32_t index : indices) {
    STRATA_ASSIGN_OR_RETURN(Value v, find(item, index));
    wanted.push_back(std::move(v));
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    const Placement& p = wanted[i].placement;
    out[i] = AlignedBuffer(p.bytes);
    STRATA_RETURN_IF_ERROR(read_pages(p, 0, footprint(p.bytes) / kIoAlignment, out[i].data()));
    if (!part_matches(out[i].bytes(), 0, p.bytes, wanted[i].checksums)) {
      return data_loss_error("KV store: chunk " + std::to_string(indices[i]) + " of item " +
                             std::to_string(item) + " (" + options_.name + " page " +
                             std::to_string(p.extents[0].start) + ") fails its checksum");
    }
  }
  return Status();
}

Status SsdTier::get_part(ItemId item, int32_t index, int64_t offset, int64_t bytes,
                         std::byte* out) const {
  STRATA_ASSIGN_OR_RETURN(Value v, find(item, index));
  const Placement& p = v.placement;
  if (offset < 0 || bytes <= 0 || offset + bytes > p.bytes) {
    return invalid_argument_error(options_.name + ": bytes [" + std::to_string(offset) + ", " +
                                  std::to_string(offset + bytes) + ") of chunk " +
                                  std::to_string(index) + " of " + std::to_string(p.bytes));
  }
  // The segments covering the part, and the pages holding them (direct I/O reads whole aligned
  // pages).
  const int64_t each = segment_of(p.bytes, std::ssize(v.checksums));
  const int64_t begin = offset / each * each;
  const int64_t end = std::min(p.bytes, (offset + bytes + each - 1) / each * each);
  const int64_t first = begin / kIoAlignment;
  const int64_t count = round_up_to_page(end) / kIoAlignment - first;
  AlignedBuffer pages(count * kIoAlignment);
  STRATA_RETURN_IF_ERROR(read_pages(p, first, count, pages.data()));
  const std::byte* segments = pages.data() + (begin - first * kIoAlignment);
  if (!part_matches({segments, static_cast<size_t>(end - begin)}, begin, p.bytes, v.checksums)) {
    return data_loss_error("KV store: bytes [" + std::to_string(offset) + ", " +
                           std::to_string(offset + bytes) + ") of chunk " + std::to_string(index) +
                           " of item " + std::to_string(item) + " (" + options_.name +
                           ") fail their checksums");
  }
  std::memcpy(out, segments + (offset - begin), static_cast<size_t>(bytes));
  return Status();
}

bool SsdTier::contains(const ChunkKey& key) const {
  std::scoped_lock lock(mutex_);
  auto it = values_.find(key.item);
  if (it == values_.end()) return false;
  auto v = it->second.find(key.index);
  return v != it->second.end() && v->second.hash == key.hash;
}

Status SsdTier::evict(ItemId item) {
  {
    std::scoped_lock lock(mutex_);
    if (!values_.contains(item)) return Status();
  }
  // The DROP must be durable before the pages can be reused.
  std::vector<std::byte> out;
  Writer w;
  w.put<uint64_t>(item);
  w.finish(kDrop, out);
  if (Status dropped = append(out); !dropped.ok()) return fail(dropped);
  std::scoped_lock lock(mutex_);
  auto it = values_.find(item);
  if (it == values_.end()) return Status();
  for (const auto& [index, v] : it->second) {
    for (const Extent& e : v.placement.extents) allocator_.free(e);
  }
  values_.erase(it);
  return Status();
}

Status SsdTier::append(std::span<const std::byte> records) {
  std::scoped_lock lock(journal_mutex_);
  STRATA_RETURN_IF_ERROR(journal_->append(records));
  return journal_->sync();
}

}  // namespace strata::store
