// Private to strata_bench: the progress bar long runs draw on stderr.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace strata::bench {

// A progress bar on stderr: redrawn in place on a terminal, one line per 10% otherwise (logs).
class Progress {
 public:
  using Clock = std::chrono::steady_clock;

  Progress(const char* label, int64_t total, bool enabled)
      : label_(label),
        total_(total),
        enabled_(enabled && total > 0),
        tty_(isatty(STDERR_FILENO) == 1),
        start_(Clock::now()) {
    if (enabled_ && tty_) draw();
  }
  ~Progress() {
    if (enabled_ && tty_) std::fputc('\n', stderr);
  }

  void advance() {
    if (!enabled_) return;
    std::lock_guard lock(mutex_);
    ++done_;
    if (tty_ || done_ * 10 / total_ != (done_ - 1) * 10 / total_) draw();
  }

 private:
  void draw() const {
    constexpr int kWidth = 30;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const int filled = static_cast<int>(kWidth * done_ / total_);
    const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    const double eta = done_ > 0 ? elapsed * static_cast<double>(total_ - done_) / done_ : 0;
    std::fprintf(stderr, "%s%s [%s] %lld/%lld  %.1fs elapsed, ~%.0fs left%s", tty_ ? "\r" : "",
                 label_, bar.c_str(), static_cast<long long>(done_), static_cast<long long>(total_),
                 elapsed, eta, tty_ ? "   " : "\n");
    std::fflush(stderr);
  }

  const char* label_;
  const int64_t total_;
  const bool enabled_;
  const bool tty_;
  const Clock::time_point start_;
  std::mutex mutex_;
  int64_t done_ = 0;
};

}  // namespace strata::bench
