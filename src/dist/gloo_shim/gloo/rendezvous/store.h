// Declarations only: the layout of gloo::IStore / gloo::rendezvous::Store in the gloo that the
// torch 2.11 wheel links into libtorch_cpu (no gloo headers ship with the wheel). c10d's
// ProcessGroupGloo.hpp defines GlooStore inline on this base, so its vtable must match the
// binary's slot for slot: [~D1, ~D0, set, get, wait_get, wait(keys, timeout), has_v2_support,
// multi_get, multi_set, append, add, wait(keys)] (docs/decisions/0003-c10d-from-cpp.md).
// gloo_backend.cpp never constructs a GlooStore itself, and checks the sizes it relies on.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#define GLOO_STORE_HAS_STORE_V2 1

namespace gloo {

class IStore {
 public:
  virtual ~IStore() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual std::vector<char> wait_get(const std::string& key,
                                     const std::chrono::milliseconds& timeout) {
    wait({key}, timeout);
    return get(key);
  }
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
  virtual bool has_v2_support() = 0;
  virtual std::vector<std::vector<char>> multi_get(const std::vector<std::string>& keys) = 0;
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::vector<char>>& values) = 0;
  virtual void append(const std::string& key, const std::vector<char>& value) = 0;
  virtual int64_t add(const std::string& key, int64_t value) = 0;
};

namespace rendezvous {

class Store : public IStore {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::seconds(30);
  ~Store() override = default;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  using IStore::wait;
};

}  // namespace rendezvous
}  // namespace gloo
