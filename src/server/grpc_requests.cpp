#include "grpc_requests.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <map>

#include "strata/common/utf8.h"

namespace strata::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

enum class Walk { kOk, kInvalidUtf8, kMalformed };

// Reads `wire` field by field as protobuf's parser would, checking each string field of `type`
// and of its nested messages; stops at the first string that is not UTF-8 (its path in *path)
// or at the first malformed byte, so protobuf never parses (and logs) such a string.
Walk walk(std::string_view wire, const Descriptor& type, std::string* path) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()),
                                            static_cast<int>(wire.size()));
  std::map<int, int> seen;  // field number -> occurrences so far (the index in a repeated field)
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      return in.CurrentPosition() == static_cast<int>(wire.size()) ? Walk::kOk : Walk::kMalformed;
    }
    const FieldDescriptor* field = type.FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
    const bool nested =
        field != nullptr &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
        (field->type() == FieldDescriptor::TYPE_STRING ||
         field->type() == FieldDescriptor::TYPE_MESSAGE);
    if (!nested) {
      if (!WireFormatLite::SkipField(&in, tag)) return Walk::kMalformed;
      continue;
    }
    uint32_t length = 0;
    std::string bytes;
    if (!in.ReadVarint32(&length) || !in.ReadString(&bytes, static_cast<int>(length))) {
      return Walk::kMalformed;
    }
    std::string name = field->name();
    const int index = seen[field->number()]++;
    if (field->is_repeated()) name.append("[").append(std::to_string(index)).append("]");
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!is_valid_utf8(bytes)) {
        *path = std::move(name);
        return Walk::kInvalidUtf8;
      }
      continue;
    }
    std::string inner;
    const Walk result = walk(bytes, *field->message_type(), &inner);
    if (result == Walk::kInvalidUtf8) *path = name + "." + inner;
    if (result != Walk::kOk) return result;
  }
}

}  // namespace

std::optional<std::string> find_invalid_utf8(std::string_view wire, const Descriptor& type) {
  std::string path;
  if (walk(wire, type, &path) == Walk::kInvalidUtf8) return path;
  return std::nullopt;
}

Status parse_request(std::string_view wire, google::protobuf::Message& message) {
  // Walked first: protobuf would log an error for each such string it parses.
  std::string path;
  const Walk walked = walk(wire, *message.GetDescriptor(), &path);
  if (walked == Walk::kInvalidUtf8) return invalid_argument_error(path + ": must be valid UTF-8");
  if (walked == Walk::kMalformed ||
      !message.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return invalid_argument_error("request: not a valid " + message.GetTypeName() + " message");
  }
  return Status::ok_status();
}

}  // namespace strata::server
