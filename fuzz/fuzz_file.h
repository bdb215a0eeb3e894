// Fuzz inputs for the loaders that take a path: the bytes in an anonymous in-memory file
// (memfd), opened through /proc/self/fd like any other path. One per process, rewritten per input.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace strata::fuzz {

inline std::string as_file(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("strata-fuzz", 0);
  if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::abort();
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace strata::fuzz
