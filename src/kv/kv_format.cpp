#include "strata/kv/kv_format.h"

#include <optional>

namespace strata::kv {

TensorLayout tensor_layout(const TensorFormat& format, int64_t num_kv_heads,
                           int64_t block_size_tokens, int64_t head_dim) {
  TensorLayout l;
  const int64_t elements = num_kv_heads * block_size_tokens * head_dim;
  l.data_bytes = elements * dtype_bits(format.dtype) / 8;
  // Scales start 16-byte aligned after the data (vector loads; fp16 alignment in any case).
  const bool scaled = dtype_is_quantized(format.dtype) && format.grouping != Grouping::kPerTensor;
  l.scales_offset = scaled ? (l.data_bytes + 15) / 16 * 16 : l.data_bytes;
  switch (format.grouping) {
    case Grouping::kNone:
    case Grouping::kPerTensor: l.groups_per_head = 0; break;
    case Grouping::kPerToken:
      l.groups_per_head = block_size_tokens * head_dim / format.group_size;
      break;
    case Grouping::kPerChannel: l.groups_per_head = head_dim; break;
  }
  l.scale_bytes = scaled ? num_kv_heads * l.groups_per_head * 2 : 0;
  l.zeros_offset = l.scales_offset + l.scale_bytes;
  l.zero_bytes = dtype_has_zero_point(format.dtype) ? l.scale_bytes : 0;
  l.total_bytes = l.zeros_offset + l.zero_bytes;
  return l;
}

int64_t block_bytes(const KvFormat& format, int64_t num_kv_heads, int64_t block_size_tokens,
                    int64_t head_dim) {
  return tensor_layout(format.key, num_kv_heads, block_size_tokens, head_dim).total_bytes +
         tensor_layout(format.value, num_kv_heads, block_size_tokens, head_dim).total_bytes;
}

Status validate(const TensorFormat& format, int64_t head_dim, int64_t block_size_tokens) {
  const std::string name = format_name(format);
  if (dtype_is_quantized(format.dtype) == (format.grouping == Grouping::kNone)) {
    return invalid_argument_error(
        "KV format " + name +
        (format.grouping == Grouping::kNone ? ": a quantized dtype needs per-token, per-channel "
                                              "or (fp8) per-tensor scales"
                                            : ": an unquantized dtype takes no groups"));
  }
  if (format.grouping == Grouping::kPerTensor && format.dtype != DType::kFloat8E4M3) {
    return invalid_argument_error("KV format " + name +
                                  ": only fp8 has a fixed per-tensor scale (integers need groups)");
  }
  if (format.grouping == Grouping::kPerToken &&
      (format.group_size <= 0 || head_dim % format.group_size != 0)) {
    return invalid_argument_error("KV format " + name + ": the group size " +
                                  std::to_string(format.group_size) + " must divide head_dim " +
                                  std::to_string(head_dim));
  }
  if (head_dim * dtype_bits(format.dtype) % 8 != 0 || block_size_tokens <= 0) {
    return invalid_argument_error("KV format " + name + ": a token's head does not fill whole bytes");
  }
  return Status();
}

std::string format_name(const TensorFormat& format) {
  std::string name = dtype_name(format.dtype);
  switch (format.grouping) {
    case Grouping::kNone: break;
    case Grouping::kPerToken: name += "/token" + std::to_string(format.group_size); break;
    case Grouping::kPerChannel: name += "/channel"; break;
    case Grouping::kPerTensor: name += "/tensor"; break;
  }
  return name;
}

KvFormat kivi_format(int bits) {
  const DType dtype = bits == 8 ? DType::kInt8 : bits == 4 ? DType::kInt4 : DType::kInt2;
  return {{dtype, Grouping::kPerChannel, 0}, {dtype, Grouping::kPerToken, 32}};
}

std::string format_name(const KvFormat& format) {
  if (format.key == format.value) return format_name(format.key);
  return "k:" + format_name(format.key) + ",v:" + format_name(format.value);
}

namespace {

std::optional<TensorFormat> parse_tensor_format(std::string_view text) {
  const size_t slash = text.find('/');
  const std::optional<DType> dtype = dtype_from_name(text.substr(0, slash));
  if (!dtype) return std::nullopt;
  TensorFormat f{*dtype, Grouping::kNone, 0};
  if (slash == std::string_view::npos) return f;
  const std::string_view grouping = text.substr(slash + 1);
  if (grouping == "channel") {
    f.grouping = Grouping::kPerChannel;
    return f;
  }
  if (grouping == "tensor") {
    f.grouping = Grouping::kPerTensor;
    return f;
  }
  constexpr std::string_view kToken = "token";
  if (!grouping.starts_with(kToken) || grouping.size() == kToken.size() ||
      grouping.size() > kToken.size() + 4) {
    return std::nullopt;
  }
  for (char c : grouping.substr(kToken.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    f.group_size = f.group_size * 10 + (c - '0');
  }
  f.grouping = Grouping::kPerToken;
  return f;
}

}  // namespace

StatusOr<KvFormat> parse_format(std::string_view name) {
  auto error = [&] {
    return invalid_argument_error(
        "unknown KV format '" + std::string(name) +
        "' (a dtype such as bfloat16, int8/token64, int4/channel, or k:FORMAT,v:FORMAT)");
  };
  if (name.starts_with("k:")) {
    const size_t comma = name.find(",v:");
    if (comma == std::string_view::npos) return error();
    const std::optional<TensorFormat> key = parse_tensor_format(name.substr(2, comma - 2));
    const std::optional<TensorFormat> value = parse_tensor_format(name.substr(comma + 3));
    if (!key || !value) return error();
    return KvFormat{*key, *value};
  }
  const std::optional<TensorFormat> both = parse_tensor_format(name);
  if (!both) return error();
  return KvFormat{*both, *both};
}

}  // namespace strata::kv
