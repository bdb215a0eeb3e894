// Test helper: an Env (store/env.h) over the real file system that injects faults into the files
// whose path contains a chosen substring, for the next N operations of a kind:
//   torn write   the first half of the bytes reach the file and the call reports success (a lost
//                tail the disk never admits: only a checksum can catch it)
//   ENOSPC       write / append / allocate fail with RESOURCE_EXHAUSTED, nothing written
//   EIO          read or write fail with UNAVAILABLE
//   fsync        sync() fails with UNAVAILABLE (the data may or may not be on disk)
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "strata/store/env.h"

namespace strata::test_util {

class FaultEnv final : public store::EnvWrapper {
 public:
  FaultEnv() : EnvWrapper(store::Env::posix()) {}

  enum class Fault { kTornWrite, kNoSpace, kReadError, kWriteError, kSyncError };

  // The next `count` operations the fault applies to, on files whose path contains `path_part`.
  void inject(Fault fault, std::string path_part, int count = 1) {
    fault_ = fault;
    path_part_ = std::move(path_part);
    remaining_ = count;
  }
  int remaining() const { return remaining_; }

  StatusOr<std::unique_ptr<store::File>> open(const std::string& path, store::OpenMode mode,
                                              bool direct) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<store::File> file, base().open(path, mode, direct));
    return std::unique_ptr<store::File>(new FaultFile(this, std::move(file)));
  }

 private:
  // True (and one fewer left) when `fault` applies to an operation on `path` now.
  bool take(Fault fault, const std::string& path) {
    if (fault_ != fault || path.find(path_part_) == std::string::npos) return false;
    int left = remaining_.load();
    while (left > 0 && !remaining_.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  }

  class FaultFile final : public store::FileWrapper {
   public:
    FaultFile(FaultEnv* env, std::unique_ptr<store::File> file)
        : FileWrapper(std::move(file)), env_(env) {}
    Status read_at(int64_t offset, std::span<std::byte> dst) const override {
      if (env_->take(Fault::kReadError, path())) return unavailable("read failed: EIO");
      return base().read_at(offset, dst);
    }
    Status write_at(int64_t offset, std::span<const std::byte> src) override {
      STRATA_RETURN_IF_ERROR(write_fault());
      if (env_->take(Fault::kTornWrite, path())) {
        const size_t half = src.size() / 2 / 4096 * 4096;  // direct I/O writes whole pages
        return half == 0 ? Status() : base().write_at(offset, src.first(half));
      }
      return base().write_at(offset, src);
    }
    Status append(std::span<const std::byte> src) override {
      STRATA_RETURN_IF_ERROR(write_fault());
      if (env_->take(Fault::kTornWrite, path())) return base().append(src.first(src.size() / 2));
      return base().append(src);
    }
    Status sync() override {
      if (env_->take(Fault::kSyncError, path())) return unavailable("fdatasync failed: EIO");
      return base().sync();
    }
    Status allocate(int64_t bytes) override {
      if (env_->take(Fault::kNoSpace, path())) {
        return resource_exhausted_error(path() + ": cannot reserve space: No space left on device");
      }
      return base().allocate(bytes);
    }

   private:
    Status unavailable(const std::string& what) const {
      return Status(StatusCode::kUnavailable, path() + ": " + what);
    }
    Status write_fault() {
      if (env_->take(Fault::kNoSpace, path())) {
        return resource_exhausted_error(path() + ": write failed: No space left on device");
      }
      if (env_->take(Fault::kWriteError, path())) return unavailable("write failed: EIO");
      return Status();
    }
    FaultEnv* env_;
  };

  Fault fault_ = Fault::kTornWrite;
  std::string path_part_;
  std::atomic<int> remaining_ = 0;
};

}  // namespace strata::test_util
