#include "strata/store/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

namespace strata::store {
namespace {

Status io_error(const std::string& path, const char* what, int err) {
  const std::string message = path + ": " + what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return resource_exhausted_error(message);
  if (err == ENOENT) return not_found_error(message);
  return Status(StatusCode::kUnavailable, message);
}

class PosixFile final : public File {
 public:
  PosixFile(std::string path, int fd, bool direct) : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixFile() override { ::close(fd_); }

  Status read_at(int64_t offset, std::span<std::byte> dst) const override {
    size_t done = 0;
    while (done < dst.size()) {
      const ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done,
                                static_cast<off_t>(offset + static_cast<int64_t>(done)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return io_error(path_, "read failed", errno);
      if (n == 0) return Status(StatusCode::kUnavailable, path_ + ": read failed: short read");
      done += static_cast<size_t>(n);
    }
    return Status();
  }
  Status write_at(int64_t offset, std::span<const std::byte> src) override {
    size_t done = 0;
    while (done < src.size()) {
      const ssize_t n = ::pwrite(fd_, src.data() + done, src.size() - done,
                                 static_cast<off_t>(offset + static_cast<int64_t>(done)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return io_error(path_, "write failed", n < 0 ? errno : EIO);
      done += static_cast<size_t>(n);
    }
    return Status();
  }
  Status append(std::span<const std::byte> src) override {
    size_t done = 0;
    while (done < src.size()) {
      const ssize_t n = ::write(fd_, src.data() + done, src.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return io_error(path_, "write failed", n < 0 ? errno : EIO);
      done += static_cast<size_t>(n);
    }
    return Status();
  }
  Status sync() override {
    if (::fdatasync(fd_) != 0) return io_error(path_, "fdatasync failed", errno);
    return Status();
  }
  Status allocate(int64_t bytes) override {
    const int rc = ::posix_fallocate(fd_, 0, bytes);
    if (rc != 0) return io_error(path_, "cannot reserve space", rc);
    return Status();
  }
  bool direct_io() const override { return direct_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  bool direct_;
};

class PosixEnv final : public Env {
 public:
  StatusOr<std::unique_ptr<File>> open(const std::string& path, OpenMode mode,
                                       bool direct) override {
    int flags = O_CLOEXEC | O_CREAT;
    switch (mode) {
      case OpenMode::kReadWrite: flags |= O_RDWR; break;
      case OpenMode::kAppend: flags |= O_WRONLY | O_APPEND; break;
      case OpenMode::kTruncate: flags |= O_WRONLY | O_TRUNC; break;
    }
    int fd = ::open(path.c_str(), flags | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
      direct = false;  // the file system refuses O_DIRECT
      fd = ::open(path.c_str(), flags, 0644);
    }
    if (fd < 0) return io_error(path, "cannot open", errno);
    return std::unique_ptr<File>(new PosixFile(path, fd, direct));
  }
  Status read_file(const std::string& path, std::vector<std::byte>* out) override {
    out->clear();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_error(path, "cannot open", errno);
    struct stat st {};
    Status status;
    if (::fstat(fd, &st) != 0) {
      status = io_error(path, "cannot stat", errno);
    } else {
      out->resize(static_cast<size_t>(st.st_size));
      PosixFile file(path, fd, false);
      status = file.read_at(0, *out);
      return status;  // `file` closed the descriptor
    }
    ::close(fd);
    return status;
  }
  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return io_error(to, "cannot replace", errno);
    return Status();
  }
  Status remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return io_error(path, "cannot remove", errno);
    return Status();
  }
  Status create_dir(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return io_error(path, "cannot create directory", ec.value());
    return Status();
  }
  Status sync_dir(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return io_error(path, "cannot open directory", errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return io_error(path, "fsync failed", err);
    return Status();
  }
};

// One disk's bandwidth: transfers are served one after another, each taking bytes / rate.
class Throttle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Throttle(int64_t bytes_per_second) : bytes_per_second_(bytes_per_second) {}
  // Waits until `bytes` of a call that started at `start` (its own I/O done meanwhile, so the
  // real transfer overlaps its paced time) have had their turn.
  void pace(size_t bytes, Clock::time_point start) {
    const auto duration = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
        static_cast<double>(bytes) / static_cast<double>(bytes_per_second_)));
    Clock::time_point done;
    {
      std::scoped_lock lock(mutex_);
      free_at_ = std::max(free_at_, start) + duration;
      done = free_at_;
    }
    std::this_thread::sleep_until(done);
  }

 private:
  const int64_t bytes_per_second_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point free_at_{};
};

class ThrottledFile final : public FileWrapper {
 public:
  ThrottledFile(std::unique_ptr<File> base, Throttle* throttle)
      : FileWrapper(std::move(base)), throttle_(throttle) {}
  Status read_at(int64_t offset, std::span<std::byte> dst) const override {
    const auto start = Throttle::Clock::now();
    return paced(base().read_at(offset, dst), dst.size(), start);
  }
  Status write_at(int64_t offset, std::span<const std::byte> src) override {
    const auto start = Throttle::Clock::now();
    return paced(base().write_at(offset, src), src.size(), start);
  }
  Status append(std::span<const std::byte> src) override {
    const auto start = Throttle::Clock::now();
    return paced(base().append(src), src.size(), start);
  }

 private:
  Status paced(Status status, size_t bytes, Throttle::Clock::time_point start) const {
    if (status.ok()) throttle_->pace(bytes, start);
    return status;
  }
  Throttle* throttle_;
};

class ThrottledEnv final : public EnvWrapper {
 public:
  ThrottledEnv(Env* base, int64_t bytes_per_second)
      : EnvWrapper(base), throttle_(bytes_per_second) {}
  StatusOr<std::unique_ptr<File>> open(const std::string& path, OpenMode mode,
                                       bool direct) override {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, base().open(path, mode, direct));
    return std::unique_ptr<File>(new ThrottledFile(std::move(file), &throttle_));
  }
  Status read_file(const std::string& path, std::vector<std::byte>* out) override {
    const auto start = Throttle::Clock::now();
    Status status = base().read_file(path, out);
    if (status.ok()) throttle_.pace(out->size(), start);
    return status;
  }

 private:
  Throttle throttle_;
};

}  // namespace

Env* Env::posix() {
  static PosixEnv env;
  return &env;
}

std::unique_ptr<Env> throttled_env(Env* base, int64_t bytes_per_second) {
  return std::make_unique<ThrottledEnv>(base, bytes_per_second);
}

}  // namespace strata::store
