// Test helper: a fresh directory under the system temp dir, removed with its contents.
#pragma once

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

namespace strata::test_util {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "strata_test_XXXXXX");
    const char* made = ::mkdtemp(templ.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed for " << templ;
    path_ = templ;
  }
  // Removes with nftw rather than std::filesystem::remove_all: binaries linking libtorch may bind
  // that symbol to the copy in libtorch.so, which crashes.
  ~TempDir() {
    ::nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) {
      return ::remove(p);
    }, 16, FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(std::string_view name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace strata::test_util
