// The HTTP server's connections, in front of httplib's request parser. httplib 0.11 gives each
// connection a pool thread from accept to close, reading with a per-recv timeout only, so clients
// that send a byte a second (or hold idle keep-alive connections) take every thread and stall
// everyone. Here one gate thread owns every connection that is between requests: it reads
// (non-blocking, poll) until a whole request is buffered, within deadlines, and only then hands
// the connection to a pool thread, which runs httplib's parser and handlers over the buffered
// bytes and writes to the socket. So a pool thread never waits on a client's request bytes, and a
// slow or idle connection costs a buffer and a descriptor, not a thread.
//
//   accept ─> ConnectionGate (one thread: read, frame, deadlines, connection limit)
//               └─ whole request ─> pool thread: httplib parses + handles, writes the response
//                                    └─ keep-alive: back to the gate with any pipelined bytes
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace strata::server {

struct ConnectionLimits {
  size_t max_connections = 1024;  // open at once; more are answered 503 and closed
  // From a request's first byte (or the connection's accept) to the end of its header.
  std::chrono::milliseconds header_timeout{10'000};
  // A keep-alive connection with no new request is closed after this.
  std::chrono::milliseconds idle_timeout{5'000};
  // From the header's end to the body's: body_timeout + body bytes / min_body_rate.
  std::chrono::milliseconds body_timeout{10'000};
  size_t min_body_bytes_per_second = 64 << 10;
  size_t max_header_bytes = 16 << 10;  // request line and header fields; larger: 431
  size_t max_body_bytes = 8 << 20;     // larger: 413 (before the body is read)
  // Bytes buffered by all connections together; a read past it is answered 503.
  size_t max_buffered_bytes = 256 << 20;
  int num_threads = 64;                            // pool threads running requests
  size_t max_requests_per_connection = 1000;       // then the connection is closed
  std::chrono::milliseconds write_timeout{5'000};  // per blocked write to a client
};

// What the first request in `buffered` needs, by HTTP/1.1 framing (RFC 9112: Content-Length or a
// chunked Transfer-Encoding; both at once, or conflicting lengths, are malformed).
enum class Framing { kIncomplete, kComplete, kMalformed, kHeaderTooLarge, kBodyTooLarge };
struct RequestFrame {
  Framing state = Framing::kIncomplete;
  size_t header_bytes = 0;        // through the blank line; 0 while the header is incomplete
  size_t request_bytes = 0;       // the whole request; set when kComplete
  size_t body_bytes = 0;          // Content-Length (0 if none or chunked)
  bool expects_continue = false;  // "Expect: 100-continue"
  size_t expect_line_begin = 0, expect_line_end = 0;  // that header line, CRLF included
};
RequestFrame frame_request(std::string_view buffered, size_t max_header_bytes,
                           size_t max_body_bytes);

// The socket of the request the calling pool thread is serving; -1 on any other thread. Handlers
// use it to notice a client that went away.
int current_connection_socket();

class ConnectionGate;

// httplib's server with its connections run through a ConnectionGate. `error_response(status,
// message)` is the body of the answers the gate gives itself (408, 413, 431, 503).
class GatedHttpServer : public httplib::Server {
 public:
  using ErrorBody = std::function<std::string(int status, std::string_view message)>;
  GatedHttpServer(const ConnectionLimits& limits, ErrorBody error_body);
  ~GatedHttpServer() override;

  // Binds `host`:`port` (0: a free port) and returns the port, or 0 if it cannot. Listens with a
  // backlog of SOMAXCONN instead of httplib's 5, so a burst of new connections waits in the
  // kernel's queue rather than being dropped and retried on the clients' SYN timers (1 s, 3 s...).
  int bind(const std::string& host, int port);

 private:
  // Called by httplib's accept loop for each new connection (on the accept thread).
  bool process_and_close_socket(socket_t sock) override;
  std::unique_ptr<ConnectionGate> gate_;
};

}  // namespace strata::server
