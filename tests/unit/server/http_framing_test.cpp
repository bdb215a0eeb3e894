// HTTP/1.1 request framing of the connection gate (http_connections.h): where a request ends,
// byte for byte, and which framings are refused (RFC 9112 sections 6 and 7).
#include <gtest/gtest.h>

#include <string>

#include "http_connections.h"

namespace strata::server {
namespace {

constexpr size_t kMaxHeader = 256;
constexpr size_t kMaxBody = 1000;

RequestFrame frame(const std::string& bytes) { return frame_request(bytes, kMaxHeader, kMaxBody); }

TEST(HttpFramingTest, ContentLengthEndsTheRequest) {
  const std::string head = "POST /v1/completions HTTP/1.1\r\ncontent-length:  5 \r\n\r\n";
  EXPECT_EQ(frame(head).state, Framing::kIncomplete);
  EXPECT_EQ(frame(head).header_bytes, head.size());
  EXPECT_EQ(frame(head).body_bytes, 5u);
  EXPECT_EQ(frame(head + "abcd").state, Framing::kIncomplete);
  const RequestFrame f = frame(head + "abcdeGET / HTTP/1.1\r\n");  // a pipelined request behind
  EXPECT_EQ(f.state, Framing::kComplete);
  EXPECT_EQ(f.request_bytes, head.size() + 5);
}

TEST(HttpFramingTest, NoBodyWithoutLength) {
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(frame(get.substr(0, get.size() - 1)).state, Framing::kIncomplete);
  const RequestFrame f = frame(get + get);
  EXPECT_EQ(f.state, Framing::kComplete);
  EXPECT_EQ(f.request_bytes, get.size());
}

TEST(HttpFramingTest, ChunkedBodyWithExtensionsAndTrailers) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
  const std::string body = "3;name=value\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n";
  for (size_t cut = 0; cut < body.size(); ++cut) {
    EXPECT_EQ(frame(head + body.substr(0, cut)).state, Framing::kIncomplete) << cut;
  }
  const RequestFrame f = frame(head + body + "GET");
  EXPECT_EQ(f.state, Framing::kComplete);
  EXPECT_EQ(f.request_bytes, head.size() + body.size());
}

TEST(HttpFramingTest, RefusedFramings) {
  const auto state = [](const std::string& bytes) { return frame(bytes).state; };
  // Two lengths that disagree, a length with chunked (request smuggling), a negative or
  // non-numeric length, a coding other than chunked last, a bad chunk size, a field without a
  // colon, a chunk without its CRLF.
  EXPECT_EQ(state("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            Framing::kMalformed);
  EXPECT_EQ(state("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx"),
            Framing::kComplete);  // repeated but equal is allowed
  EXPECT_EQ(state("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Framing::kMalformed);
  EXPECT_EQ(state("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), Framing::kMalformed);
  EXPECT_EQ(state("POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n"), Framing::kMalformed);
  EXPECT_EQ(state("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
            Framing::kMalformed);
  EXPECT_EQ(state("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            Framing::kMalformed);
  EXPECT_EQ(state("GET / HTTP/1.1\r\nno colon\r\n\r\n"), Framing::kMalformed);
  EXPECT_EQ(state("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n"),
            Framing::kMalformed);
}

TEST(HttpFramingTest, ChunkedFramingIsBounded) {
  // The gate frames its buffer again at each read: more than 4,096 chunks or 16 KiB of trailer
  // fields are refused rather than walked again and again.
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string chunks;
  for (int i = 0; i < 4095; ++i) chunks += "0001\r\nx\r\n";
  const auto with_room = [&](size_t max_body) {
    return frame_request(head + chunks + "0\r\n\r\n", kMaxHeader, max_body).state;
  };
  EXPECT_EQ(with_room(1 << 20), Framing::kComplete);  // 4,095 chunks and the last one
  chunks += "0001\r\nx\r\n";
  EXPECT_EQ(with_room(1 << 20), Framing::kMalformed);
  std::string trailers;
  for (int i = 0; i < 20; ++i) trailers += "X-T: " + std::string(1000, 'a') + "\r\n";
  EXPECT_EQ(frame(head + "0\r\n" + trailers).state, Framing::kMalformed);
  const std::string four_trailers = trailers.substr(0, trailers.size() / 5);
  EXPECT_EQ(frame(head + "0\r\n" + four_trailers + "\r\n").state, Framing::kComplete);
}

TEST(HttpFramingTest, Limits) {
  EXPECT_EQ(frame("GET / HTTP/1.1\r\nX: " + std::string(kMaxHeader, 'a')).state,
            Framing::kHeaderTooLarge);
  EXPECT_EQ(frame("GET / HTTP/1.1\r\nX: " + std::string(kMaxHeader, 'a') + "\r\n\r\n").state,
            Framing::kHeaderTooLarge);
  EXPECT_EQ(frame("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n").state, Framing::kBodyTooLarge);
  EXPECT_EQ(frame("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n").state,
            Framing::kBodyTooLarge);
  EXPECT_EQ(frame("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3E9\r\n").state,
            Framing::kBodyTooLarge);
  EXPECT_EQ(frame("POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + std::string(1000, 'x')).state,
            Framing::kComplete);
}

TEST(HttpFramingTest, ExpectContinueLineIsLocated) {
  const std::string request =
      "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\n";
  const RequestFrame f = frame(request);
  EXPECT_EQ(f.state, Framing::kIncomplete);
  ASSERT_TRUE(f.expects_continue);
  EXPECT_EQ(request.substr(f.expect_line_begin, f.expect_line_end - f.expect_line_begin),
            "Expect: 100-Continue\r\n");
}

}  // namespace
}  // namespace strata::server
