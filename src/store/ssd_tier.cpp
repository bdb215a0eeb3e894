#include "strata/store/ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <spdlog/spdlog.h>

#include "strata/common/check.h"

namespace strata::store {
namespace {

constexpr uint64_t kMagic = 0x564b415441525453ULL;  // "STRATAKV"
constexpr uint32_t kVersion = 1;
enum RecordType : uint32_t { kHeader = 1, kPut = 2, kDrop = 3 };

std::string errno_text() { return std::strerror(errno); }

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
    frame.put<uint32_t>(static_cast<uint32_t>(payload_.size()));
    frame.put<uint32_t>(type);
    out.insert(out.end(), frame.payload_.begin(), frame.payload_.end());
    out.insert(out.end(), payload_.begin(), payload_.end());
    const uint64_t sum = XXH3_64bits(payload_.data(), payload_.size());
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

void encode_header(const SsdOptions& o, std::vector<std::byte>& out) {
  Writer w;
  w.put<uint64_t>(kMagic);
  w.put<uint32_t>(kVersion);
  w.put<int64_t>(o.slot_bytes);
  w.put<int64_t>(o.file_bytes);
  w.put<uint64_t>(o.layout_tag);
  w.finish(kHeader, out);
}

void encode_put(const ItemRecord& item, const ChunkRecord& c, std::vector<std::byte>& out) {
  Writer w;
  w.put<uint64_t>(c.item);
  w.put<int32_t>(c.chunk_index);
  w.put<uint64_t>(c.hash.low);
  w.put<uint64_t>(c.hash.high);
  w.put<int64_t>(c.slot);
  w.put<uint64_t>(c.checksum);
  w.put<uint8_t>(item.exact ? 1 : 0);
  w.put<int64_t>(item.token_offset);
  w.put_string(item.session);
  w.finish(kPut, out);
}

Status sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return internal_error(dir + ": cannot open directory: " + errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return internal_error(dir + ": fsync failed: " + errno_text());
  return Status();
}

Status write_all(int fd, std::span<const std::byte> data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return internal_error(path + ": write failed: " + errno_text());
    done += static_cast<size_t>(n);
  }
  return Status();
}

}  // namespace

SsdTier::SsdTier(const SsdOptions& options, std::vector<Extent> regions)
    : options_(options), allocator_(regions) {}

SsdTier::~SsdTier() {
  for (int fd : fds_) ::close(fd);
  if (journal_fd_ >= 0) ::close(journal_fd_);
}

std::string SsdTier::data_path(int64_t file) const {
  char name[32];
  std::snprintf(name, sizeof(name), "data-%03lld.bin", static_cast<long long>(file));
  return options_.dir + "/" + name;
}

std::string SsdTier::journal_path() const { return options_.dir + "/index.journal"; }

StatusOr<std::unique_ptr<SsdTier>> SsdTier::open(const SsdOptions& options,
                                                 std::vector<RecoveredItem>* recovered) {
  if (options.slot_bytes <= 0 || options.slot_bytes % kIoAlignment != 0) {
    return invalid_argument_error("store.ssd: slot size must be a positive multiple of 4096");
  }
  if (options.file_bytes < options.slot_bytes) {
    return invalid_argument_error("store.ssd.file_bytes must hold at least one chunk of " +
                                  std::to_string(options.slot_bytes) + " bytes");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return internal_error(options.dir + ": cannot create directory: " + ec.message());

  // Data files: as many as the capacity asks for and the disk holds.
  const int64_t slots_per_file = options.file_bytes / options.slot_bytes;
  const int64_t total_slots = options.capacity_bytes / options.slot_bytes;
  const int64_t wanted_files = (total_slots + slots_per_file - 1) / slots_per_file;
  std::vector<int> fds;
  std::vector<Extent> regions;
  bool direct = options.direct_io;
  auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  for (int64_t f = 0; f < wanted_files; ++f) {
    const int64_t slots = std::min(slots_per_file, total_slots - f * slots_per_file);
    char name[32];
    std::snprintf(name, sizeof(name), "/data-%03lld.bin", static_cast<long long>(f));
    const std::string path = options.dir + name;
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
      spdlog::warn("{}: the file system does not support O_DIRECT; using buffered I/O", path);
      direct = false;
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
      close_all();
      return internal_error(path + ": cannot open: " + errno_text());
    }
    const int rc = ::posix_fallocate(fd, 0, slots * options.slot_bytes);
    if (rc != 0) {
      ::close(fd);
      ::unlink(path.c_str());
      spdlog::warn("{}: cannot reserve {} MiB ({}); the SSD tier keeps {} of {} files", path,
                   (slots * options.slot_bytes) >> 20, std::strerror(rc), f, wanted_files);
      break;
    }
    fds.push_back(fd);
    regions.push_back({f * slots_per_file, slots});
  }
  if (fds.empty()) {
    return resource_exhausted_error(options.dir + ": no room for even one SSD tier file");
  }
  std::unique_ptr<SsdTier> tier(new SsdTier(options, regions));
  tier->fds_ = std::move(fds);
  tier->slots_per_file_ = slots_per_file;
  tier->direct_io_ = direct;
  STRATA_RETURN_IF_ERROR(tier->recover(recovered));
  return tier;
}

Status SsdTier::recover(std::vector<RecoveredItem>* recovered) {
  recovered->clear();
  const std::string path = journal_path();
  std::vector<std::byte> data;
  if (const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
    struct stat st {};
    if (::fstat(fd, &st) == 0) {
      data.resize(static_cast<size_t>(st.st_size));
      size_t done = 0;
      while (done < data.size()) {
        const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      data.resize(done);
    }
    ::close(fd);
  }

  struct Pending {
    ItemRecord attributes;
    std::map<int32_t, ChunkRecord> chunks;
  };
  std::map<ItemId, Pending> items;
  bool header_ok = false;
  int64_t good_records = 0;
  bool torn = false;
  size_t pos = 0;
  constexpr size_t kFrame = 2 * sizeof(uint32_t), kSum = sizeof(uint64_t);
  while (pos < data.size()) {
    Reader frame(std::span<const std::byte>(data).subspan(pos));
    uint32_t size = 0, type = 0;
    if (!frame.get(&size) || !frame.get(&type) || pos + kFrame + size + kSum > data.size()) {
      torn = true;
      break;
    }
    const std::span<const std::byte> payload(data.data() + pos + kFrame, size);
    uint64_t sum = 0;
    std::memcpy(&sum, data.data() + pos + kFrame + size, kSum);
    if (sum != XXH3_64bits(payload.data(), payload.size())) {
      torn = true;
      break;
    }
    pos += kFrame + size + kSum;
    Reader p(payload);
    if (!header_ok) {
      uint64_t magic = 0;
      uint32_t version = 0;
      int64_t slot_bytes = 0, file_bytes = 0;
      uint64_t tag = 0;
      header_ok = type == kHeader && p.get(&magic) && p.get(&version) && p.get(&slot_bytes) &&
                  p.get(&file_bytes) && p.get(&tag) && magic == kMagic && version == kVersion &&
                  slot_bytes == options_.slot_bytes && file_bytes == options_.file_bytes &&
                  tag == options_.layout_tag;
      if (!header_ok) {
        spdlog::warn("{}: written for another model or layout; the SSD tier starts empty", path);
        break;
      }
    } else if (type == kPut) {
      ChunkRecord c;
      ItemRecord item;
      uint8_t exact = 0;
      if (!(p.get(&c.item) && p.get(&c.chunk_index) && p.get(&c.hash.low) &&
            p.get(&c.hash.high) && p.get(&c.slot) && p.get(&c.checksum) && p.get(&exact) &&
            p.get(&item.token_offset) && p.get_string(&item.session))) {
        torn = true;
        break;
      }
      item.exact = exact != 0;
      Pending& pending = items[c.item];
      pending.attributes = item;
      pending.chunks[c.chunk_index] = c;
    } else if (type == kDrop) {
      ItemId id = 0;
      if (!p.get(&id)) {
        torn = true;
        break;
      }
      items.erase(id);
    }
    ++good_records;
  }
  if (torn) spdlog::warn("{}: ignoring a torn or corrupt tail after {} records", path, good_records);

  // Rebuild: each item keeps its chunks 0..k-1 whose slots exist and are not claimed twice.
  int64_t dropped_chunks = 0;
  for (auto& [id, pending] : items) {
    RecoveredItem item{id, pending.attributes, {}};
    for (auto& [index, chunk] : pending.chunks) {
      if (index != static_cast<int32_t>(item.chunks.size()) ||
          !allocator_.mark_used({chunk.slot, 1})) {
        break;
      }
      item.chunks.push_back(chunk);
    }
    dropped_chunks += static_cast<int64_t>(pending.chunks.size() - item.chunks.size());
    if (!item.chunks.empty()) recovered->push_back(std::move(item));
  }
  if (dropped_chunks > 0) {
    spdlog::warn("{}: dropped {} chunks that were out of range or out of order", path, dropped_chunks);
  }

  // Compact: a fresh journal with the header and one PUT per surviving chunk, swapped in atomically.
  std::vector<std::byte> out;
  encode_header(options_, out);
  for (const RecoveredItem& item : *recovered) {
    for (const ChunkRecord& c : item.chunks) encode_put(item.attributes, c, out);
  }
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return internal_error(tmp + ": cannot create: " + errno_text());
  Status status = write_all(fd, out, tmp);
  if (status.ok() && ::fsync(fd) != 0) status = internal_error(tmp + ": fsync: " + errno_text());
  ::close(fd);
  STRATA_RETURN_IF_ERROR(status);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return internal_error(path + ": cannot replace the journal: " + errno_text());
  }
  STRATA_RETURN_IF_ERROR(sync_directory(options_.dir));
  journal_fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (journal_fd_ < 0) return internal_error(path + ": cannot open: " + errno_text());
  return Status();
}

std::optional<std::vector<int64_t>> SsdTier::allocate(int64_t n) {
  std::optional<std::vector<Extent>> extents = allocator_.allocate(n);
  if (!extents) return std::nullopt;
  std::vector<int64_t> slots;
  slots.reserve(static_cast<size_t>(n));
  for (const Extent& e : *extents) {
    for (int64_t i = 0; i < e.length; ++i) slots.push_back(e.start + i);
  }
  return slots;
}

void SsdTier::free(std::span<const int64_t> slots) {
  for (int64_t slot : slots) allocator_.free({slot, 1});
}

namespace {

// Runs of consecutive slots inside one file: [begin, end) indices into `slots`.
template <typename Fn>
Status for_each_run(std::span<const int64_t> slots, int64_t slots_per_file, Fn fn) {
  size_t begin = 0;
  while (begin < slots.size()) {
    size_t end = begin + 1;
    while (end < slots.size() && end - begin < IOV_MAX && slots[end] == slots[end - 1] + 1 &&
           slots[end] / slots_per_file == slots[begin] / slots_per_file) {
      ++end;
    }
    STRATA_RETURN_IF_ERROR(fn(begin, end));
    begin = end;
  }
  return Status();
}

}  // namespace

Status SsdTier::write(std::span<const int64_t> slots,
                      std::span<const std::byte* const> buffers) const {
  STRATA_CHECK_EQ(slots.size(), buffers.size());
  std::vector<int> touched;
  STRATA_RETURN_IF_ERROR(for_each_run(slots, slots_per_file_, [&](size_t begin, size_t end) {
    const int64_t file = slots[begin] / slots_per_file_;
    std::vector<iovec> iov;
    for (size_t i = begin; i < end; ++i) {
      iov.push_back({const_cast<std::byte*>(buffers[i]), static_cast<size_t>(options_.slot_bytes)});
    }
    const int64_t offset = (slots[begin] % slots_per_file_) * options_.slot_bytes;
    const ssize_t want = static_cast<ssize_t>((end - begin) * options_.slot_bytes);
    ssize_t n;
    do {
      n = ::pwritev(fds_[file], iov.data(), static_cast<int>(iov.size()), offset);
    } while (n < 0 && errno == EINTR);
    if (n != want) {
      return Status(StatusCode::kUnavailable,
                    data_path(file) + ": write failed: " + (n < 0 ? errno_text() : "short write"));
    }
    if (std::find(touched.begin(), touched.end(), fds_[file]) == touched.end()) {
      touched.push_back(fds_[file]);
    }
    return Status();
  }));
  for (int fd : touched) {
    if (::fdatasync(fd) != 0) {
      return Status(StatusCode::kUnavailable, "SSD tier: fdatasync failed: " + errno_text());
    }
  }
  return Status();
}

Status SsdTier::read(std::span<const int64_t> slots, std::span<std::byte* const> buffers) const {
  STRATA_CHECK_EQ(slots.size(), buffers.size());
  return for_each_run(slots, slots_per_file_, [&](size_t begin, size_t end) {
    const int64_t file = slots[begin] / slots_per_file_;
    std::vector<iovec> iov;
    for (size_t i = begin; i < end; ++i) {
      iov.push_back({buffers[i], static_cast<size_t>(options_.slot_bytes)});
    }
    const int64_t offset = (slots[begin] % slots_per_file_) * options_.slot_bytes;
    const ssize_t want = static_cast<ssize_t>((end - begin) * options_.slot_bytes);
    ssize_t n;
    do {
      n = ::preadv(fds_[file], iov.data(), static_cast<int>(iov.size()), offset);
    } while (n < 0 && errno == EINTR);
    if (n != want) {
      return Status(StatusCode::kUnavailable,
                    data_path(file) + ": read failed: " + (n < 0 ? errno_text() : "short read"));
    }
    return Status();
  });
}

Status SsdTier::append(std::span<const std::byte> records) {
  std::scoped_lock lock(journal_mutex_);
  STRATA_RETURN_IF_ERROR(write_all(journal_fd_, records, journal_path()));
  if (::fdatasync(journal_fd_) != 0) {
    return Status(StatusCode::kUnavailable, journal_path() + ": fdatasync: " + errno_text());
  }
  return Status();
}

Status SsdTier::journal_put(const ItemRecord& item, std::span<const ChunkRecord> chunks) {
  std::vector<std::byte> out;
  for (const ChunkRecord& c : chunks) encode_put(item, c, out);
  return append(out);
}

Status SsdTier::journal_drop(ItemId item) {
  std::vector<std::byte> out;
  Writer w;
  w.put<uint64_t>(item);
  w.finish(kDrop, out);
  return append(out);
}

}  // namespace strata::store
