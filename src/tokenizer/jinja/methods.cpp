// Attribute and item access, the methods of str / dict / list, string formatting and the globals
// (declared in builtins.h).
#include <algorithm>
#include <cstdio>

#include "builtins.h"
#include "strings.h"

namespace strata::tokenizer::jinja {
namespace {

Value method(const std::string& name, std::function<Value(Args&)> fn) {
  return Value::callable(name, [fn = std::move(fn), name](Args& args) {
    Value out = fn(args);
    args.expect_consumed(name);
    return out;
  });
}

bool starts_or_ends_with(const std::string& s, const Value& affix, bool start) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) throw TemplateError("startswith/endswith expects str or a tuple of str");
    const std::string& x = a.as_string();
    return x.size() <= s.size() && (start ? s.compare(0, x.size(), x) == 0
                                          : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (affix.is_list()) {
    return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  }
  return one(affix);
}

// str.format(*args, **kwargs) with "{}", "{0}", "{name}", "{{", "}}" and an ignored ":spec" of
// only "" (anything else is refused rather than rendered differently).
TString str_format(const TString& format, Args& args) {
  TString out;
  size_t auto_index = 0;
  const std::string& f = format.text;
  size_t literal_begin = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out.append(format.slice(literal_begin, i + 1));
      literal_begin = ++i + 1;
      continue;
    }
    if (f[i] != '{') continue;
    out.append(format.slice(literal_begin, i));
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.append(format.slice(i, i + 1));
      literal_begin = i + 2;
      ++i;
      continue;
    }
    const size_t close = f.find('}', i);
    if (close == std::string::npos) throw TemplateError("Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    if (field.find(':') != std::string::npos || field.find('!') != std::string::npos) {
      throw TemplateError("str.format: conversions and format specs are not supported");
    }
    Value v;
    if (field.empty()) {
      v = args.take(auto_index++, "\x01");
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      v = args.take(std::stoul(field), "\x01");
    } else {
      v = args.take(SIZE_MAX, field);
    }
    if (v.is_undefined()) throw TemplateError("str.format: missing argument '" + field + "'");
    out.append(to_tstring(v));
    literal_begin = close + 1;
    i = close;
  }
  out.append(format.slice(literal_begin, f.size()));
  args.positional.clear();  // Python ignores unused arguments
  args.keyword.clear();
  return out;
}

Value string_method(const Value& self, const std::string& name) {
  const TString s = self.as_tstring();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return method(name, [s, name](Args& a) {
      return Value(python_strip_tstring(s, a.take(0, "chars"), name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "split" || name == "rsplit") {
    return method(name, [s, name](Args& a) {
      const Value sep = a.take(0, "sep");
      const Value max = a.take(1, "maxsplit");
      return Value::list(python_split(s, sep, max.is_int() ? max.as_int() : -1, name == "rsplit"));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return method(name, [s, name](Args& a) {
      return Value(starts_or_ends_with(s.text, a.take(0, "prefix"), name == "startswith"));
    });
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    return method(name, [s, name](Args&) {
      if (name == "upper") return Value(s.derived(ascii_upper(s.text)));
      if (name == "lower") return Value(s.derived(ascii_lower(s.text)));
      if (name == "capitalize") return Value(s.derived(python_capitalize(s.text)));
      return Value(s.derived(jinja_title(s.text)));
    });
  }
  if (name == "replace") {
    return method(name, [s](Args& a) {
      const Value old_text = a.take(0, "old");
      const Value new_text = a.take(1, "new");
      const Value count = a.take(2, "count");
      if (!old_text.is_string() || !new_text.is_string()) {
        throw TemplateError("replace() arguments must be str");
      }
      TString r = python_replace(s.text, old_text.as_string(), new_text.as_string(),
                                 count.is_int() ? count.as_int() : -1);
      return Value(s.is_tainted() || new_text.as_tstring().is_tainted()
                       ? TString::untrusted(std::move(r.text))
                       : r);
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return method(name, [s, name](Args& a) {
      const Value sub = a.take(0, "sub");
      if (!sub.is_string()) throw TemplateError(name + "() argument must be str");
      const std::string& x = sub.as_string();
      if (name == "count") {
        int64_t n = 0;
        if (x.empty()) return Value(Value(s.text).length() + 1);
        for (size_t p = s.text.find(x); p != std::string::npos; p = s.text.find(x, p + x.size()))
          ++n;
        return Value(n);
      }
      const size_t at = name == "find" ? s.text.find(x) : s.text.rfind(x);
      if (at == std::string::npos) return Value(int64_t{-1});
      return Value(Value(s.text.substr(0, at)).length());  // code point index
    });
  }
  if (name == "format") {
    return method(name, [s](Args& a) { return Value(str_format(s, a)); });
  }
  if (name == "join") {
    return method(name, [s](Args& a) {
      Args join_args;
      join_args.positional.push_back(Value(s));
      return apply_filter("join", a.take(0, "iterable"), join_args);
    });
  }
  if (name == "splitlines") {
    return method(name, [s](Args&) {
      List lines = python_split(s, Value("\n"), -1);
      if (!lines.empty() && lines.back().as_string().empty()) lines.pop_back();
      for (Value& line : lines) {
        const std::string& t = line.as_string();
        if (!t.empty() && t.back() == '\r') line = Value(line.as_tstring().slice(0, t.size() - 1));
      }
      return Value::list(std::move(lines));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    return method(name, [s, name](Args& a) {
      const Value affix = a.take(0, "affix");
      if (!affix.is_string()) throw TemplateError(name + "() argument must be str");
      const std::string& x = affix.as_string();
      if (!starts_or_ends_with(s.text, affix, name == "removeprefix")) return Value(s);
      return Value(name == "removeprefix" ? s.slice(x.size(), s.text.size())
                                          : s.slice(0, s.text.size() - x.size()));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
    return method(name, [s, name](Args&) {
      if (s.text.empty()) return Value(false);
      return Value(std::all_of(s.text.begin(), s.text.end(), [&](char c) {
        const auto u = static_cast<unsigned char>(c);
        if (name == "isdigit") return std::isdigit(u) != 0;
        if (name == "isalpha") return std::isalpha(u) != 0;
        if (name == "isalnum") return std::isalnum(u) != 0;
        return std::isspace(u) != 0;
      }));
    });
  }
  return Value::undefined(name);
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return method(name, [self, name](Args&) {
      List out;
      for (const auto& [key, item] : self.as_dict().items) {
        if (name == "items") out.push_back(Value::list({Value(key), item}, true));
        if (name == "keys") out.emplace_back(key);
        if (name == "values") out.push_back(item);
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return method(name, [self](Args& a) {
      const Value key = a.take(0, "key");
      Value fallback = a.take(1, "default");
      if (key.is_string()) {
        if (const Value* v = self.as_dict().find(key.as_string())) return *v;
      }
      return fallback.is_undefined() ? Value::none() : fallback;
    });
  }
  return Value::undefined(name);
}

bool is_mutating_method(const std::string& name) {
  static const char* const kNames[] = {"append",     "extend", "insert", "pop",
                                       "popitem",    "remove", "clear",  "update",
                                       "setdefault", "sort",   "reverse"};
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return name == n; });
}

// Python index normalisation for negative indices; -1 when out of range.
int64_t normalise_index(int64_t index, int64_t size) {
  if (index < 0) index += size;
  return index < 0 || index >= size ? -1 : index;
}

}  // namespace

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) {
    throw TemplateError("'" + (object.name().empty() ? std::string("value") : object.name()) +
                        "' is undefined (reading attribute '" + name + "')");
  }
  if (object.is_dict()) {
    const Dict& d = object.as_dict();
    if (!d.is_namespace && (object.is_dict() && is_mutating_method(name))) {
      throw TemplateError("access to attribute '" + name + "' of 'dict' object is unsafe");
    }
    if (!d.is_namespace) {
      if (Value m = dict_method(object, name); !m.is_undefined()) return m;
    }
    if (const Value* v = d.find(name)) return *v;
    return Value::undefined(name);
  }
  if (object.is_string()) return string_method(object, name);
  if (object.is_list() && is_mutating_method(name)) {
    throw TemplateError("access to attribute '" + name + "' of '" + type_name(object) +
                        "' object is unsafe");
  }
  return Value::undefined(name);
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) {
    throw TemplateError("'" + (object.name().empty() ? std::string("value") : object.name()) +
                        "' is undefined (reading an item)");
  }
  if (object.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = object.as_dict().find(key.as_string())) return *v;
      return get_attribute(object, key.as_string());
    }
    return Value::undefined();
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    if (object.is_list()) {
      const List& items = object.as_list();
      const int64_t i = normalise_index(key.as_int(), static_cast<int64_t>(items.size()));
      return i < 0 ? Value::undefined() : items[static_cast<size_t>(i)];
    }
    Args none;
    const List chars = apply_filter("list", object, none).as_list();
    const int64_t i = normalise_index(key.as_int(), static_cast<int64_t>(chars.size()));
    return i < 0 ? Value::undefined() : chars[static_cast<size_t>(i)];
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined();
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (!object.is_list() && !object.is_string()) {
    throw TemplateError(std::string("'") + type_name(object) + "' object is not subscriptable");
  }
  Args none;
  const List items =
      object.is_list() ? object.as_list() : apply_filter("list", object, none).as_list();
  const auto n = static_cast<int64_t>(items.size());
  const int64_t k = step.is_undefined() || step.is_none() ? 1 : step.as_int();
  if (k == 0) throw TemplateError("slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t fallback) {
    if (v.is_undefined() || v.is_none()) return fallback;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    return k > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = bound(start, k > 0 ? 0 : n - 1);
  const int64_t e = bound(stop, k > 0 ? n : -1);
  List out;
  for (int64_t i = b; k > 0 ? i < e : i > e; i += k) out.push_back(items[static_cast<size_t>(i)]);
  if (object.is_list()) return Value::list(std::move(out), object.is_tuple());
  TString s;
  for (const Value& c : out) s.append(c.as_tstring());
  return Value(std::move(s));
}

TString percent_format(const TString& format, const Value& args) {
  const List values = args.is_tuple() ? args.as_list() : List{args};
  const bool mapping = args.is_dict();
  size_t next = 0;
  TString out;
  const std::string& f = format.text;
  size_t literal_begin = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') continue;
    out.append(format.slice(literal_begin, i));
    if (i + 1 >= f.size()) throw TemplateError("incomplete format");
    size_t j = i + 1;
    Value v;
    if (f[j] == '(') {
      const size_t close = f.find(')', j);
      if (!mapping || close == std::string::npos) throw TemplateError("format requires a mapping");
      const Value* found = args.as_dict().find(f.substr(j + 1, close - j - 1));
      if (!found) throw TemplateError("format: missing key");
      v = *found;
      j = close + 1;
    }
    std::string spec;
    while (j < f.size() &&
           std::string_view("0123456789.-+ #").find(f[j]) != std::string_view::npos) {
      spec.push_back(f[j++]);
    }
    if (j >= f.size()) throw TemplateError("incomplete format");
    const char conv = f[j];
    if (conv == '%') {
      out.append("%");
    } else {
      if (v.is_undefined() && f[i + 1] != '(') {
        if (next >= values.size()) throw TemplateError("not enough arguments for format string");
        v = values[next++];
      }
      if (conv == 's') {
        out.append(to_tstring(v));
      } else if (conv == 'r') {
        out.append(TString(python_repr(v)));
      } else if (conv == 'd' || conv == 'i' || conv == 'f' || conv == 'e' || conv == 'g' ||
                 conv == 'x') {
        char buf[64];
        const std::string c_spec = "%" + spec +
                                   (conv == 'i'   ? std::string("lld")
                                    : conv == 'd' ? std::string("lld")
                                    : conv == 'x' ? "llx"
                                                  : std::string(1, conv));
        if (conv == 'd' || conv == 'i' || conv == 'x') {
          std::snprintf(buf, sizeof(buf), c_spec.c_str(), static_cast<long long>(v.as_number()));
        } else {
          std::snprintf(buf, sizeof(buf), c_spec.c_str(), v.as_number());
        }
        out.append(std::string(buf));
      } else {
        throw TemplateError(std::string("unsupported format character '") + conv + "'");
      }
    }
    literal_begin = j + 1;
    i = j;
  }
  out.append(format.slice(literal_begin, f.size()));
  if (!mapping && next < values.size() && args.is_tuple()) {
    throw TemplateError("not all arguments converted during string formatting");
  }
  return out;
}

Dict make_globals(std::time_t now) {
  Dict g;
  g.set("range", Value::callable("range", [](Args& a) {
          Value first = a.take(0, "start");
          Value second = a.take(1, "stop");
          Value third = a.take(2, "step");
          a.expect_consumed("range");
          int64_t start = 0, stop = 0, step = 1;
          if (second.is_undefined()) {
            stop = first.as_int();
          } else {
            start = first.as_int();
            stop = second.as_int();
            if (!third.is_undefined()) step = third.as_int();
          }
          if (step == 0) throw TemplateError("range() arg 3 must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
          if (out.size() > 100000) throw TemplateError("range too big");
          return Value::list(std::move(out));
        }));
  auto make_mapping = [](Args& a, bool is_namespace) {
    auto d = std::make_shared<Dict>();
    d->is_namespace = is_namespace;
    if (!a.positional.empty()) {
      if (!a.positional[0].is_dict()) throw TemplateError("dict()/namespace() expects a mapping");
      d->items = a.positional[0].as_dict().items;
    }
    for (auto& [key, value] : a.keyword) {
      if (is_namespace && !key.empty() && key[0] == '_') {
        throw TemplateError(
            "Chat templates cannot store underscore-prefixed attributes on a namespace");
      }
      d->set(key, value);
    }
    return Value::dict(std::move(d));
  };
  g.set("namespace",
        Value::callable("namespace", [make_mapping](Args& a) { return make_mapping(a, true); }));
  g.set("dict",
        Value::callable("dict", [make_mapping](Args& a) { return make_mapping(a, false); }));
  g.set("raise_exception", Value::callable("raise_exception", [](Args& a) -> Value {
          throw TemplateError("raise_exception: " + to_tstring(a.take(0, "message")).text);
        }));
  g.set("strftime_now", Value::callable("strftime_now", [now](Args& a) {
          const Value format = a.take(0, "format");
          a.expect_consumed("strftime_now");
          if (!format.is_string()) throw TemplateError("strftime_now expects a format string");
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof(buf), format.as_string().c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  return g;
}

}  // namespace strata::tokenizer::jinja
