// gRPC request validation on arbitrary wire bytes, against protobuf's own parser: parse_request
// accepts exactly what protobuf accepts (protobuf rejects strings that are not UTF-8 too), into
// the same message, and when it rejects a message for a string it names a string that is not
// UTF-8.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/grpc_requests.h"
#include "strata/v1/generation.pb.h"

namespace {

template <class Message>
void check(std::string_view wire) {
  Message ours;
  Message theirs;
  const strata::Status status = strata::server::parse_request(wire, ours);
  const bool accepted = theirs.ParseFromArray(wire.data(), static_cast<int>(wire.size()));
  if (status.ok() != accepted) std::abort();
  if (accepted && ours.SerializeAsString() != theirs.SerializeAsString()) std::abort();
  const auto field = strata::server::find_invalid_utf8(wire, *Message::descriptor());
  if (field.has_value() != (status.message().find("must be valid UTF-8") != std::string::npos)) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // protobuf's parser logs each non-UTF-8 string
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view wire(reinterpret_cast<const char*>(data), size);
  check<strata::v1::ChatRequest>(wire);
  check<strata::v1::GenerateRequest>(wire);
  check<strata::v1::AbortRequest>(wire);
  return 0;
}
