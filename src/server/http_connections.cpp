#include "http_connections.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace strata::server {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_connection_socket = -1;

// How long an answered error waits for the client to stop sending (see ConnectionGate::drop).
constexpr std::chrono::seconds kLinger{5};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The end of a chunked body that starts at `pos`: kComplete with request_bytes, or why not.
// The gate frames a connection's buffer again at each read, so the walk is bounded: at most
// kMaxChunks chunks and kMaxTrailer bytes of trailer fields (more is malformed).
RequestFrame frame_chunked(std::string_view b, size_t pos, size_t max_body_bytes,
                           RequestFrame frame) {
  constexpr size_t kMaxLine = 1024;  // a chunk-size line or a trailer field
  constexpr int kMaxChunks = 4096;
  constexpr size_t kMaxTrailer = 16 * kMaxLine;
  size_t body = 0;
  for (int chunk = 0;; ++chunk) {
    if (chunk == kMaxChunks) {
      frame.state = Framing::kMalformed;
      return frame;
    }
    const size_t eol = b.find("\r\n", pos);
    if (eol == std::string_view::npos) {
      frame.state = b.size() - pos > kMaxLine ? Framing::kMalformed : Framing::kIncomplete;
      return frame;
    }
    std::string_view line = b.substr(pos, eol - pos);
    line = trim(line.substr(0, line.find(';')));  // chunk extensions are ignored
    size_t size = 0;
    const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
    if (line.empty() || ec != std::errc() || end != line.data() + line.size()) {
      frame.state = Framing::kMalformed;
      return frame;
    }
    pos = eol + 2;
    if (size == 0) break;
    if (size > max_body_bytes - body) {
      frame.state = Framing::kBodyTooLarge;
      return frame;
    }
    body += size;
    if (b.size() < pos + size + 2) {
      frame.state = Framing::kIncomplete;
      return frame;
    }
    if (b.substr(pos + size, 2) != "\r\n") {
      frame.state = Framing::kMalformed;
      return frame;
    }
    pos += size + 2;
  }
  // Trailer fields, then a blank line.
  const size_t trailer = pos;
  for (;;) {
    const size_t eol = b.find("\r\n", pos);
    if (std::min(eol, b.size()) - trailer > kMaxTrailer) {
      frame.state = Framing::kMalformed;
      return frame;
    }
    if (eol == std::string_view::npos) {
      frame.state = b.size() - pos > kMaxLine ? Framing::kMalformed : Framing::kIncomplete;
      return frame;
    }
    const bool blank = eol == pos;
    pos = eol + 2;
    if (blank) break;
  }
  frame.state = Framing::kComplete;
  frame.request_bytes = pos;
  return frame;
}

}  // namespace

RequestFrame frame_request(std::string_view b, size_t max_header_bytes, size_t max_body_bytes) {
  RequestFrame frame;
  const size_t end = b.find("\r\n\r\n");
  if (end == std::string_view::npos || end + 4 > max_header_bytes) {
    const bool over = (end == std::string_view::npos ? b.size() : end + 4) > max_header_bytes;
    frame.state = over ? Framing::kHeaderTooLarge : Framing::kIncomplete;
    return frame;
  }
  frame.header_bytes = end + 4;
  std::optional<size_t> content_length;
  bool chunked = false;
  size_t pos = b.find("\r\n") + 2;  // past the request line
  while (pos < end + 2) {
    const size_t eol = b.find("\r\n", pos);
    const std::string_view line = b.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      frame.state = Framing::kMalformed;
      return frame;
    }
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim(line.substr(colon + 1));
    if (iequals(name, "Content-Length")) {
      size_t n = 0;
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || ec != std::errc() || p != value.data() + value.size() ||
          (content_length && *content_length != n)) {
        frame.state =
            ec == std::errc::result_out_of_range ? Framing::kBodyTooLarge : Framing::kMalformed;
        return frame;
      }
      content_length = n;
    } else if (iequals(name, "Transfer-Encoding")) {
      // Only "chunked" as the last coding frames a request body (RFC 9112 6.3).
      const size_t comma = value.rfind(',');
      chunked = iequals(trim(comma == std::string_view::npos ? value : value.substr(comma + 1)),
                        "chunked");
      if (!chunked) {
        frame.state = Framing::kMalformed;
        return frame;
      }
    } else if (iequals(name, "Expect") && iequals(value, "100-continue")) {
      frame.expects_continue = true;
      frame.expect_line_begin = pos;
      frame.expect_line_end = eol + 2;
    }
    pos = eol + 2;
  }
  if (chunked && content_length) {
    frame.state = Framing::kMalformed;  // a request-smuggling shape
    return frame;
  }
  if (chunked) return frame_chunked(b, frame.header_bytes, max_body_bytes, frame);
  const size_t body = content_length.value_or(0);
  frame.body_bytes = body;
  if (body > max_body_bytes) {
    frame.state = Framing::kBodyTooLarge;
    return frame;
  }
  if (b.size() - frame.header_bytes >= body) {
    frame.state = Framing::kComplete;
    frame.request_bytes = frame.header_bytes + body;
  }
  return frame;
}

int current_connection_socket() { return t_connection_socket; }

namespace {

std::string numeric_host(const sockaddr_storage& address, socklen_t length, int& port) {
  char host[NI_MAXHOST] = {};
  char service[NI_MAXSERV] = {};
  getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof(host), service,
              sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV);
  port = std::atoi(service);
  return host;
}

// A connection between accept and close: its socket and the bytes read but not yet served.
struct Connection {
  int fd = -1;
  std::string buffer;
  size_t requests_served = 0;
  // While the gate holds it:
  Clock::time_point deadline;
  bool header_done = false;  // the first buffered request's header is complete
  bool lingering = false;    // answered with an error; what arrives is discarded until close
};

// httplib's view of one buffered request: reads come from the buffer (the gate buffered the whole
// request, so a read past it means the parser wanted more than the framing said: end of stream),
// writes go to the non-blocking socket, each waiting up to the write timeout.
class BufferedStream final : public httplib::Stream {
 public:
  BufferedStream(Connection& connection, std::chrono::milliseconds write_timeout)
      : c_(connection), write_timeout_ms_(static_cast<int>(write_timeout.count())) {}

  size_t consumed() const { return pos_; }

  bool is_readable() const override { return pos_ < c_.buffer.size(); }
  bool is_writable() const override {
    pollfd p{c_.fd, POLLOUT, 0};
    return poll(&p, 1, write_timeout_ms_) > 0 && !(p.revents & (POLLERR | POLLHUP));
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.buffer.size() - pos_);
    if (n == 0) return -1;
    std::copy_n(c_.buffer.data() + pos_, n, ptr);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      const ssize_t n = send(c_.fd, ptr, size, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      pollfd p{c_.fd, POLLOUT, 0};
      if (poll(&p, 1, write_timeout_ms_) <= 0 || (p.revents & (POLLERR | POLLHUP))) return -1;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (getpeername(c_.fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      ip = numeric_host(a, len, port);
    }
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (getsockname(c_.fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      ip = numeric_host(a, len, port);
    }
  }
  socket_t socket() const override { return c_.fd; }

 private:
  Connection& c_;
  size_t pos_ = 0;
  int write_timeout_ms_;
};

// Best effort: a short answer to a connection the gate is about to close.
void send_and_forget(int fd, const std::string& bytes) {
  (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

const char* reason_phrase(int status) {
  switch (status) {
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 400:
      return "Bad Request";
    default:
      return "Service Unavailable";
  }
}

// httplib's accept loop hands each connection to the gate on its own thread.
class InlineQueue final : public httplib::TaskQueue {
 public:
  explicit InlineQueue(std::function<void()> on_shutdown) : on_shutdown_(std::move(on_shutdown)) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { on_shutdown_(); }

 private:
  std::function<void()> on_shutdown_;
};

}  // namespace

class ConnectionGate {
 public:
  // Runs one buffered request on a pool thread; false: close the connection after it.
  using Serve = std::function<bool(httplib::Stream&, bool close_connection, bool& closed)>;

  ConnectionGate(const ConnectionLimits& limits, GatedHttpServer::ErrorBody error_body, Serve serve)
      : limits_(limits),
        error_body_(std::move(error_body)),
        serve_(std::move(serve)),
        wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    gate_thread_ = std::thread([this] { run_gate(); });
    for (int i = 0; i < limits_.num_threads; ++i) pool_.emplace_back([this] { run_pool(); });
  }

  ~ConnectionGate() {
    stop();
    close(wake_fd_);
  }

  // On the accept thread.
  void admit(int fd) {
    if (open_.fetch_add(1) >= limits_.max_connections || stopping_) {
      refuse(fd, 503, "too many open connections; try again later");
      return;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->deadline = Clock::now() + limits_.header_timeout;
    hand_to_gate(std::move(c));
  }

  // Closes the connections between requests, lets the pool finish the requests it has, joins.
  void stop() {
    if (stopping_.exchange(true)) return;
    wake();
    gate_thread_.join();
    {
      std::lock_guard lock(pool_mutex_);
      pool_stopping_ = true;
    }
    pool_cv_.notify_all();
    for (auto& t : pool_) t.join();
  }

 private:
  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }

  void hand_to_gate(std::unique_ptr<Connection> c) {
    {
      std::lock_guard lock(inbox_mutex_);
      if (!gate_closed_) {
        inbox_.push_back(std::move(c));
        c = nullptr;
      }
    }
    if (c) {
      close_connection(c->fd);  // stop() began: nothing waits for new requests
    } else {
      wake();
    }
  }

  std::string error_response(int status, std::string_view message) const {
    const std::string body = error_body_(status, message);
    return "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
           "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
  }

  void refuse(int fd, int status, std::string_view message) {
    send_and_forget(fd, error_response(status, message));
    close_connection(fd);
  }

  void close_connection(int fd) {
    shutdown(fd, SHUT_RDWR);
    close(fd);
    open_.fetch_sub(1);
  }

  // Closes `c`, or with a status answers it first and then lingers: reads and discards what the
  // client still sends (a body it is pushing) for up to 5 s, so that the client, once it has sent
  // everything, reads the answer instead of a reset.
  void drop(std::unique_ptr<Connection>& c, std::optional<int> status = {},
            std::string_view message = {}) {
    buffered_ -= c->buffer.size();
    c->buffer.clear();
    if (!status || stopping_) {
      close_connection(c->fd);
      c.reset();
      return;
    }
    send_and_forget(c->fd, error_response(*status, message));
    shutdown(c->fd, SHUT_WR);
    c->lingering = true;
    c->deadline = Clock::now() + kLinger;
  }

  void discard(std::unique_ptr<Connection>& c) {
    char chunk[65536];
    for (;;) {
      const ssize_t n = recv(c->fd, chunk, sizeof(chunk), 0);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return drop(c);  // the client closed
    }
  }

  // Reads what `c` has; dispatches it, drops it, or leaves it waiting.
  void on_readable(std::unique_ptr<Connection>& c) {
    if (c->lingering) return discard(c);
    char chunk[16384];
    for (;;) {
      const ssize_t n = recv(c->fd, chunk, sizeof(chunk), 0);
      if (n == 0) return drop(c);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return drop(c);
      }
      if (c->buffer.empty()) c->deadline = Clock::now() + limits_.header_timeout;
      if (buffered_ + n > limits_.max_buffered_bytes) {
        return drop(c, 503, "the server is buffering too much request data; try again later");
      }
      c->buffer.append(chunk, n);
      buffered_ += n;
      if (static_cast<size_t>(n) < sizeof(chunk)) break;
    }
    advance(c);
  }

  // Acts on the framing of `c`'s buffer.
  void advance(std::unique_ptr<Connection>& c) {
    RequestFrame f = frame_request(c->buffer, limits_.max_header_bytes, limits_.max_body_bytes);
    if (f.expects_continue && f.state == Framing::kIncomplete) {
      // The client waits for this before it sends the body; httplib must not send it again.
      c->buffer.erase(f.expect_line_begin, f.expect_line_end - f.expect_line_begin);
      buffered_ -= f.expect_line_end - f.expect_line_begin;
      send_and_forget(c->fd, "HTTP/1.1 100 Continue\r\n\r\n");
      f = frame_request(c->buffer, limits_.max_header_bytes, limits_.max_body_bytes);
    }
    switch (f.state) {
      case Framing::kComplete: {
        if (f.expects_continue) {  // the body came anyway: the header line is simply dropped
          c->buffer.erase(f.expect_line_begin, f.expect_line_end - f.expect_line_begin);
          buffered_ -= f.expect_line_end - f.expect_line_begin;
        }
        buffered_ -= c->buffer.size();
        {
          std::lock_guard lock(pool_mutex_);
          ready_.push_back(std::move(c));
        }
        pool_cv_.notify_one();
        return;
      }
      case Framing::kIncomplete:
        if (f.header_bytes > 0 && !c->header_done) {
          c->header_done = true;
          const auto rate = std::max<size_t>(1, limits_.min_body_bytes_per_second);
          c->deadline = Clock::now() + limits_.body_timeout +
                        std::chrono::milliseconds(1000 * f.body_bytes / rate);
        }
        return;
      case Framing::kMalformed:
        return drop(c, 400, "malformed HTTP request framing");
      case Framing::kHeaderTooLarge:
        return drop(c, 431,
                    "The request header exceeds the limit of " +
                        std::to_string(limits_.max_header_bytes) + " bytes");
      case Framing::kBodyTooLarge:
        return drop(c, 413,
                    "The request body exceeds the limit of " +
                        std::to_string(limits_.max_body_bytes) + " bytes");
    }
  }

  void run_gate() {
    std::vector<std::unique_ptr<Connection>> waiting;
    std::vector<pollfd> fds;
    while (!stopping_) {
      {
        std::lock_guard lock(inbox_mutex_);
        for (auto& c : inbox_) {
          buffered_ += c->buffer.size();
          waiting.push_back(std::move(c));
          // A kept-alive connection may hold its next request already (pipelining).
          if (!waiting.back()->buffer.empty()) advance(waiting.back());
        }
        inbox_.clear();
      }
      std::erase(waiting, nullptr);
      const auto now = Clock::now();
      Clock::time_point next = now + std::chrono::seconds(1);
      for (auto& c : waiting) {
        if (c->deadline <= now) {
          if (c->buffer.empty() || c->lingering) {
            drop(c);
          } else {
            drop(c, 408, "the request did not arrive in time");
          }
        } else {
          next = std::min(next, c->deadline);
        }
      }
      std::erase(waiting, nullptr);
      fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
      for (const auto& c : waiting) fds.push_back(pollfd{c->fd, POLLIN, 0});
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - now);
      if (poll(fds.data(), fds.size(), static_cast<int>(wait.count())) < 0 && errno != EINTR) {
        break;
      }
      if (fds[0].revents & POLLIN) {
        uint64_t count;
        (void)!::read(wake_fd_, &count, sizeof(count));
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) on_readable(waiting[i - 1]);
      }
    }
    for (auto& c : waiting) {
      if (c) drop(c);
    }
    std::lock_guard lock(inbox_mutex_);
    gate_closed_ = true;
    for (auto& c : inbox_) {
      buffered_ += c->buffer.size();
      drop(c);
    }
    inbox_.clear();
  }

  void run_pool() {
    for (;;) {
      std::unique_ptr<Connection> c;
      {
        std::unique_lock lock(pool_mutex_);
        pool_cv_.wait(lock, [&] { return pool_stopping_ || !ready_.empty(); });
        if (ready_.empty()) return;
        c = std::move(ready_.front());
        ready_.pop_front();
      }
      t_connection_socket = c->fd;
      BufferedStream stream(*c, limits_.write_timeout);
      bool closed = false;
      const bool last = ++c->requests_served >= limits_.max_requests_per_connection || stopping_;
      const bool ok = serve_(stream, last, closed);
      t_connection_socket = -1;
      c->buffer.erase(0, stream.consumed());
      if (!ok || closed || last || stopping_) {
        close_connection(c->fd);
        continue;
      }
      c->header_done = false;
      c->deadline =
          Clock::now() + (c->buffer.empty() ? limits_.idle_timeout : limits_.header_timeout);
      hand_to_gate(std::move(c));
    }
  }

  const ConnectionLimits limits_;
  const GatedHttpServer::ErrorBody error_body_;
  const Serve serve_;
  const int wake_fd_;
  std::atomic<size_t> open_{0};
  std::atomic<bool> stopping_{false};
  size_t buffered_ = 0;  // bytes in the gate's connections (gate thread only)

  std::mutex inbox_mutex_;
  std::vector<std::unique_ptr<Connection>> inbox_;  // newly accepted or kept alive
  bool gate_closed_ = false;  // the gate thread ended: connections handed to it are closed

  std::mutex pool_mutex_;
  std::condition_variable pool_cv_;
  std::deque<std::unique_ptr<Connection>> ready_;  // a whole request buffered
  bool pool_stopping_ = false;

  std::thread gate_thread_;
  std::vector<std::thread> pool_;
};

GatedHttpServer::GatedHttpServer(const ConnectionLimits& limits, ErrorBody error_body) {
  set_payload_max_length(limits.max_body_bytes);
  gate_ = std::make_unique<ConnectionGate>(
      limits, std::move(error_body),
      [this](httplib::Stream& stream, bool close_connection, bool& closed) {
        return process_request(stream, close_connection, closed, nullptr);
      });
  new_task_queue = [this] { return new InlineQueue([this] { gate_->stop(); }); };
}

GatedHttpServer::~GatedHttpServer() { gate_->stop(); }

int GatedHttpServer::bind(const std::string& host, int port) {
  if (port == 0) {
    port = bind_to_any_port(host);
  } else if (!bind_to_port(host, port)) {
    port = 0;
  }
  if (port > 0 && ::listen(svr_sock_, SOMAXCONN) != 0) return 0;
  return std::max(port, 0);
}

bool GatedHttpServer::process_and_close_socket(socket_t sock) {
  gate_->admit(sock);
  return true;
}

}  // namespace strata::server
