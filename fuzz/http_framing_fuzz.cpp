// HTTP/1.1 request framing on arbitrary bytes: a complete request lies within the buffer and
// after its header; an incomplete one never claims a length.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/http_connections.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using strata::server::Framing;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto frame = strata::server::frame_request(bytes, 4096, 1 << 16);
  if (frame.state == Framing::kComplete) {
    if (frame.request_bytes > size || frame.request_bytes < frame.header_bytes ||
        frame.header_bytes == 0) {
      std::abort();
    }
    // The same request followed by anything frames the same.
    std::string more(bytes.substr(0, frame.request_bytes));
    more += "GET / HTTP/1.1\r\n";
    const auto again = strata::server::frame_request(more, 4096, 1 << 16);
    if (again.state != Framing::kComplete || again.request_bytes != frame.request_bytes) {
      std::abort();
    }
  } else if (frame.request_bytes != 0) {
    std::abort();
  }
  return 0;
}
