#include "grpc_requests.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/unknown_field_set.h>

#include <map>

#include "strata/common/utf8.h"

namespace strata::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

constexpr int kMaxDepth = 16;  // our messages nest 2 deep; deeper input is not ours to walk

std::optional<std::string> find_in(std::string_view wire, const Descriptor& type, int depth) {
  UnknownFieldSet fields;
  if (depth > kMaxDepth || !fields.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return std::nullopt;
  }
  std::map<int, int> seen;  // field number -> occurrences so far (the index in a repeated field)
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& f = fields.field(i);
    const int index = seen[f.number()]++;
    const FieldDescriptor* field = type.FindFieldByNumber(f.number());
    if (field == nullptr || f.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    std::string path = field->name();
    if (field->is_repeated()) path.append("[").append(std::to_string(index)).append("]");
    const std::string& bytes = f.length_delimited();
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!is_valid_utf8(bytes)) return path;
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (auto inner = find_in(bytes, *field->message_type(), depth + 1)) {
        return path + "." + *inner;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> find_invalid_utf8(std::string_view wire, const Descriptor& type) {
  return find_in(wire, type, 0);
}

Status parse_request(std::string_view wire, google::protobuf::Message& message) {
  // Checked first: protobuf would log an error for each such field it parses.
  if (std::optional<std::string> field = find_invalid_utf8(wire, *message.GetDescriptor())) {
    return invalid_argument_error(*field + ": must be valid UTF-8");
  }
  if (!message.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return invalid_argument_error("request: not a valid " + message.GetTypeName() + " message");
  }
  return Status::ok_status();
}

}  // namespace strata::server
