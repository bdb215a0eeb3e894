// The file-system interface under the SSD tier (LevelDB's Env): every file operation the tier
// makes goes through it, so tests put a fault-injecting Env in its place (torn writes, ENOSPC,
// EIO, failed fsync) and production uses Env::posix().
//
// Errors: RESOURCE_EXHAUSTED when the disk is full (ENOSPC), NOT_FOUND for a missing file,
// UNAVAILABLE for any other I/O error; every message names the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/common/status.h"

namespace strata::store {

class File {
 public:
  virtual ~File() = default;
  // The whole span is read or written, or an error is returned.
  virtual Status read_at(int64_t offset, std::span<std::byte> dst) const = 0;
  virtual Status write_at(int64_t offset, std::span<const std::byte> src) = 0;
  virtual Status append(std::span<const std::byte> src) = 0;
  virtual Status sync() = 0;                     // fdatasync
  virtual Status allocate(int64_t bytes) = 0;    // posix_fallocate from offset 0
  virtual bool direct_io() const = 0;            // O_DIRECT: buffers and offsets 4 KiB aligned
  virtual const std::string& path() const = 0;
};

enum class OpenMode {
  kReadWrite,  // created if missing, kept if present (data files)
  kAppend,     // created if missing, writes go to the end (journals)
  kTruncate,   // created or emptied (a journal being rewritten)
};

class Env {
 public:
  virtual ~Env() = default;
  // With `direct`, asks for O_DIRECT and falls back to buffered I/O where the file system
  // refuses it (File::direct_io() tells which).
  virtual StatusOr<std::unique_ptr<File>> open(const std::string& path, OpenMode mode,
                                               bool direct) = 0;
  // A whole file's contents.
  virtual Status read_file(const std::string& path, std::vector<std::byte>* out) = 0;
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  virtual Status remove(const std::string& path) = 0;
  virtual Status create_dir(const std::string& path) = 0;  // and its parents
  virtual Status sync_dir(const std::string& path) = 0;

  // The process-wide POSIX implementation.
  static Env* posix();
};

// A File that passes every call to the file it wraps: a wrapper (pacing, fault injection)
// overrides the calls it changes.
class FileWrapper : public File {
 public:
  explicit FileWrapper(std::unique_ptr<File> base) : base_(std::move(base)) {}
  Status read_at(int64_t offset, std::span<std::byte> dst) const override {
    return base_->read_at(offset, dst);
  }
  Status write_at(int64_t offset, std::span<const std::byte> src) override {
    return base_->write_at(offset, src);
  }
  Status append(std::span<const std::byte> src) override { return base_->append(src); }
  Status sync() override { return base_->sync(); }
  Status allocate(int64_t bytes) override { return base_->allocate(bytes); }
  bool direct_io() const override { return base_->direct_io(); }
  const std::string& path() const override { return base_->path(); }

 protected:
  File& base() const { return *base_; }

 private:
  std::unique_ptr<File> base_;
};

// An Env that passes every call to `base` (which must outlive it), as FileWrapper does.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* base) : base_(base) {}
  StatusOr<std::unique_ptr<File>> open(const std::string& path, OpenMode mode,
                                       bool direct) override {
    return base_->open(path, mode, direct);
  }
  Status read_file(const std::string& path, std::vector<std::byte>* out) override {
    return base_->read_file(path, out);
  }
  Status rename(const std::string& from, const std::string& to) override {
    return base_->rename(from, to);
  }
  Status remove(const std::string& path) override { return base_->remove(path); }
  Status create_dir(const std::string& path) override { return base_->create_dir(path); }
  Status sync_dir(const std::string& path) override { return base_->sync_dir(path); }

 protected:
  Env& base() const { return *base_; }

 private:
  Env* base_;
};

// `base` with the bytes its files read and write paced to at most `bytes_per_second`: one budget
// for every file and both directions, as one disk has; a call returns once the time its bytes
// take on that budget has passed (syncs, allocation and directory calls are not paced). For
// measuring the store against a slower disk than the machine's (kv_store.ssd_bandwidth_limit).
// `base` must outlive it.
std::unique_ptr<Env> throttled_env(Env* base, int64_t bytes_per_second);

}  // namespace strata::store
