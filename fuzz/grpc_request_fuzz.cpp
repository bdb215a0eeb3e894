// gRPC request validation on arbitrary wire bytes: what parse_request accepts protobuf accepts
// too, and every string in it is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/grpc_requests.h"
#include "strata/common/utf8.h"
#include "strata/v1/generation.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view wire(reinterpret_cast<const char*>(data), size);
  strata::v1::ChatRequest chat;
  if (strata::server::parse_request(wire, chat).ok()) {
    for (const auto& m : chat.messages()) {
      if (!strata::is_valid_utf8(m.content()) || !strata::is_valid_utf8(m.role())) {
        std::abort();
      }
    }
    if (!strata::is_valid_utf8(chat.session_id())) std::abort();
  }
  strata::v1::GenerateRequest generate;
  if (strata::server::parse_request(wire, generate).ok()) {
    if (!strata::is_valid_utf8(generate.prompt())) std::abort();
    for (const auto& stop : generate.sampling().stop()) {
      if (!strata::is_valid_utf8(stop)) std::abort();
    }
  }
  return 0;
}
