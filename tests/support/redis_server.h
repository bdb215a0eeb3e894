// Test helper: a real redis-server (Debian's package) on a free loopback port, started and stopped
// by the test, without persistence. redis-cli (installed with it) runs commands against it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/free_port.h"

namespace strata::test_util {

class RedisServer {
 public:
  // Starts a server with `args` added to its command line ("--maxmemory", "2mb", ...), and with
  // AUTH required when `password` is set (redis-cli then sends it).
  explicit RedisServer(std::vector<std::string> args = {}, const std::string& password = {})
      : args_(std::move(args)) {
    if (!password.empty()) {
      args_.insert(args_.end(), {"--requirepass", password});
      auth_ = " --no-auth-warning -a " + password;
    }
    port_ = free_port();
    start();
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  bool running() const { return pid_ > 0; }

  // Starts it again on the same port (empty: a restarted server has lost every key).
  void start() {
    ASSERT_EQ(pid_, 0);
    std::vector<std::string> argv = {"redis-server",    "--port", std::to_string(port_),
                                     "--bind",          "127.0.0.1",
                                     "--save",          "",
                                     "--appendonly",    "no",
                                     "--loglevel",      "warning"};
    argv.insert(argv.end(), args_.begin(), args_.end());
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);  // its start-up banner
      ::dup2(null, STDOUT_FILENO);
      std::vector<char*> c;
      for (std::string& a : argv) c.push_back(a.data());
      c.push_back(nullptr);
      ::execvp("redis-server", c.data());
      std::perror("redis-server (install it: scripts/bootstrap.sh)");
      ::_exit(127);
    }
    for (int i = 0; i < 200; ++i) {
      if (cli("PING") == "PONG\n") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    FAIL() << "redis-server did not answer on port " << port_;
  }

  // Stops it at once (SIGKILL: like a crash).
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

  // redis-cli's output for `command` (words split by the shell; --raw output).
  std::string cli(const std::string& command) const {
    std::string line = "redis-cli --raw -p " + std::to_string(port_) + auth_ + " " + command +
                       " 2>/dev/null";
    FILE* p = ::popen(line.c_str(), "r");
    if (p == nullptr) return {};
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
  }

 private:
  std::vector<std::string> args_;
  int port_ = 0;
  pid_t pid_ = 0;
  std::string auth_;
};

}  // namespace strata::test_util
