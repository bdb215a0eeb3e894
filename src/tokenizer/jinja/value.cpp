#include "value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace strata::tokenizer::jinja {

TString TString::untrusted(std::string t) {
  TString s(std::move(t));
  if (!s.text.empty()) s.tainted.push_back({0, static_cast<uint32_t>(s.text.size())});
  return s;
}

void TString::append(const TString& other) {
  const auto offset = static_cast<uint32_t>(text.size());
  for (Span span : other.tainted) {
    span.begin += offset;
    span.end += offset;
    if (!tainted.empty() && tainted.back().end == span.begin) {
      tainted.back().end = span.end;
    } else {
      tainted.push_back(span);
    }
  }
  text.append(other.text);
}

TString TString::derived(std::string t) const {
  return is_tainted() ? untrusted(std::move(t)) : TString(std::move(t));
}

TString TString::slice(size_t begin, size_t end) const {
  TString out(text.substr(begin, end - begin));
  for (Span span : tainted) {
    const size_t b = std::max<size_t>(span.begin, begin);
    const size_t e = std::min<size_t>(span.end, end);
    if (b < e)
      out.tainted.push_back({static_cast<uint32_t>(b - begin), static_cast<uint32_t>(e - begin)});
  }
  return out;
}

Value Value::undefined(std::string name) {
  Value v;
  v.s_.text = std::move(name);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), f_(d) {}
Value::Value(TString s) : kind_(Kind::kString), s_(std::move(s)) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}
Value::Value(const char* s) : kind_(Kind::kString), s_(std::string(s)) {}

Value Value::list(List items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::move(d);
  return v;
}

Value Value::callable(std::string name, Callable fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.s_.text = std::move(name);
  v.fn_ = std::make_shared<Callable>(std::move(fn));
  return v;
}

double Value::as_number() const {
  switch (kind_) {
    case Kind::kBool:
      return b_ ? 1 : 0;
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kFloat:
      return f_;
    default:
      throw TemplateError(std::string("expected a number, got ") + type_name(*this));
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.text.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return dict_->is_namespace || !dict_->items.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

int64_t Value::length() const {
  switch (kind_) {
    case Kind::kString: {
      int64_t n = 0;  // code points, as Python's len(str)
      for (char c : s_.text) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
      return n;
    }
    case Kind::kList:
      return static_cast<int64_t>(list_->size());
    case Kind::kDict:
      return static_cast<int64_t>(dict_->items.size());
    default:
      throw TemplateError(std::string("object of type '") + type_name(*this) + "' has no len()");
  }
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Args::take(size_t index, std::string_view name) {
  if (used_.size() < positional.size() + keyword.size()) {
    used_.assign(positional.size() + keyword.size(), false);
  }
  for (size_t i = 0; i < keyword.size(); ++i) {
    if (keyword[i].first == name) {
      used_[positional.size() + i] = true;
      return keyword[i].second;
    }
  }
  if (index < positional.size()) {
    used_[index] = true;
    return positional[index];
  }
  return Value();
}

void Args::expect_consumed(std::string_view function) const {
  const size_t total = positional.size() + keyword.size();
  for (size_t i = 0; i < total; ++i) {
    if (i < used_.size() && used_[i]) continue;
    if (i < positional.size()) {
      throw TemplateError(std::string(function) + "() got too many positional arguments");
    }
    throw TemplateError(std::string(function) + "() got an unexpected keyword argument '" +
                        keyword[i - positional.size()].first + "'");
  }
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: positional for exponents in [-4, 16),
  // scientific ("1e-05", "1.5e+16") otherwise, and always a '.0' or exponent on whole numbers.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, end);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out.append("0.").append(static_cast<size_t>(-exponent - 1), '0').append(digits);
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out.append(digits).append(exponent + 1 - digits.size(), '0').append(".0");
    } else {
      out.append(digits, 0, exponent + 1).append(".").append(digits, exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out.append(".").append(digits, 1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

namespace {

// Python's repr of a str: single quotes unless the text has a single quote and no double quote;
// backslash, the quote, \n \r \t escaped, other control characters as \xNN, the rest verbatim
// (printable non-ASCII stays as is).
std::string python_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    const auto u = static_cast<uint8_t>(c);
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  out.push_back(quote);
  return out;
}

void repr_into(const Value& v, TString* out) {
  if (v.is_string()) {
    out->append(v.as_tstring().derived(python_string_repr(v.as_string())));
    return;
  }
  if (v.is_list()) {
    out->append(v.is_tuple() ? "(" : "[");
    const List& items = v.as_list();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out->append(", ");
      repr_into(items[i], out);
    }
    if (v.is_tuple() && items.size() == 1) out->append(",");
    out->append(v.is_tuple() ? ")" : "]");
    return;
  }
  if (v.is_dict()) {
    const Dict& d = v.as_dict();
    if (d.is_namespace) {
      out->append("<Namespace ");
    }
    out->append("{");
    bool first = true;
    for (const auto& [key, item] : d.items) {
      if (!first) out->append(", ");
      first = false;
      out->append(python_string_repr(key));
      out->append(": ");
      repr_into(item, out);
    }
    out->append("}");
    if (d.is_namespace) out->append(">");
    return;
  }
  out->append(to_tstring(v));
}

void json_string_into(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    const auto u = static_cast<uint8_t>(c);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", u);
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

struct JsonWriter {
  int indent;
  std::string_view item_separator;
  std::string_view key_separator;
  bool sort_keys;

  void newline(int depth, std::string* out) const {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * depth), ' ');
  }

  void write(const Value& v, int depth, std::string* out) const {
    switch (v.kind()) {
      case Value::Kind::kNone:
        *out += "null";
        return;
      case Value::Kind::kBool:
        *out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        *out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat: {
        const double d = v.as_number();
        *out += std::isnan(d)   ? "NaN"
                : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                                : python_float_repr(d);
        return;
      }
      case Value::Kind::kString:
        json_string_into(v.as_string(), out);
        return;
      case Value::Kind::kList: {
        const List& items = v.as_list();
        if (items.empty()) {
          *out += "[]";
          return;
        }
        out->push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out->append(item_separator);
          if (indent >= 0) newline(depth + 1, out);
          write(items[i], depth + 1, out);
        }
        if (indent >= 0) newline(depth, out);
        out->push_back(']');
        return;
      }
      case Value::Kind::kDict: {
        std::vector<const std::pair<std::string, Value>*> items;
        for (const auto& item : v.as_dict().items) items.push_back(&item);
        if (sort_keys) {
          std::stable_sort(items.begin(), items.end(),
                           [](const auto* a, const auto* b) { return a->first < b->first; });
        }
        if (items.empty()) {
          *out += "{}";
          return;
        }
        out->push_back('{');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out->append(item_separator);
          if (indent >= 0) newline(depth + 1, out);
          json_string_into(items[i]->first, out);
          out->append(key_separator);
          write(items[i]->second, depth + 1, out);
        }
        if (indent >= 0) newline(depth, out);
        out->push_back('}');
        return;
      }
      default:
        throw TemplateError(std::string("Object of type ") + type_name(v) +
                            " is not JSON serializable");
    }
  }
};

}  // namespace

TString to_tstring(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return TString();
    case Value::Kind::kNone:
      return TString("None");
    case Value::Kind::kBool:
      return TString(v.as_bool() ? "True" : "False");
    case Value::Kind::kInt:
      return TString(std::to_string(v.as_int()));
    case Value::Kind::kFloat:
      return TString(python_float_repr(v.as_number()));
    case Value::Kind::kString:
      return v.as_tstring();
    case Value::Kind::kCallable:
      return TString("<function " + v.name() + ">");
    case Value::Kind::kList:
    case Value::Kind::kDict:
      break;
  }
  TString out;
  repr_into(v, &out);
  return out;
}

std::string python_repr(const Value& v) {
  TString out;
  repr_into(v, &out);
  return out.text;
}

std::string to_json(const Value& v, int indent, std::string_view item_separator,
                    std::string_view key_separator, bool sort_keys) {
  std::string out;
  JsonWriter{indent, item_separator, key_separator, sort_keys}.write(v, 0, &out);
  return out;
}

Value from_json(const nlohmann::ordered_json& json, bool untrusted) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      std::string s = json.get<std::string>();
      return untrusted ? Value(TString::untrusted(std::move(s))) : Value(std::move(s));
    }
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item, untrusted));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (const auto& [key, item] : json.items()) d->set(key, from_json(item, untrusted));
      return Value::dict(std::move(d));
    }
    case nlohmann::ordered_json::value_t::binary:
      break;
  }
  throw TemplateError("binary JSON values cannot be passed to a template");
}

bool equals(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (a.is_float() || b.is_float()) return a.as_number() == b.as_number();
    return a.as_number() == b.as_number();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.is_namespace || y.is_namespace) return a.dict_ptr() == b.dict_ptr();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [key, item] : x.items) {
        const Value* other = y.find(key);
        if (!other || !equals(item, *other)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_number();
      const double y = b.as_number();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order = code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (const int c = compare(x[i], y[i]); c != 0) return c;
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw TemplateError(std::string("'<' not supported between instances of '") + type_name(a) +
                      "' and '" + type_name(b) + "'");
}

const char* type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict:
      return v.as_dict().is_namespace ? "Namespace" : "dict";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

}  // namespace strata::tokenizer::jinja
