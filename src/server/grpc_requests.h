// gRPC request messages read from their wire bytes by the service itself. gRPC's own parse answers
// a string field that is not UTF-8 (proto3 requires it) with INTERNAL and an empty message; this
// names the field instead, and the service answers INVALID_ARGUMENT.
#pragma once

#include <google/protobuf/message.h>

#include <optional>
#include <string>
#include <string_view>

#include "strata/common/status.h"

namespace strata::server {

// The first string field in `wire` (a serialized message of type `type`, nested messages
// included) whose bytes are not valid UTF-8, as a path like "messages[1].content"; nullopt if
// there is none before the end or the first malformed byte.
std::optional<std::string> find_invalid_utf8(std::string_view wire,
                                             const google::protobuf::Descriptor& type);

// Parses `wire` into `message`. INVALID_ARGUMENT "<path>: must be valid UTF-8" for such a string
// field, or "request: not a valid <type> message" for bytes protobuf cannot parse.
Status parse_request(std::string_view wire, google::protobuf::Message& message);

}  // namespace strata::server
