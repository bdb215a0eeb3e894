#include "builtins.h"

#include <algorithm>
#include <cmath>

#include "strings.h"

namespace strata::tokenizer::jinja {
namespace {

int64_t int_arg(const Value& v, int64_t fallback, const char* what) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (v.is_int() || v.is_bool()) return v.is_bool() ? v.as_bool() : v.as_int();
  throw TemplateError(std::string(what) + ": expected an integer, got " + type_name(v));
}

bool bool_arg(const Value& v, bool fallback) { return v.is_undefined() ? fallback : v.truthy(); }

const TString& string_arg(const Value& v, const char* what) {
  if (!v.is_string()) {
    throw TemplateError(std::string(what) + ": expected a string, got " + type_name(v));
  }
  return v.as_tstring();
}

// The items `for x in v` visits: list items, dict keys, string characters.
List iterate(const Value& v) {
  if (v.is_list()) return v.as_list();
  if (v.is_undefined()) return {};
  if (v.is_dict()) {
    List keys;
    for (const auto& [key, item] : v.as_dict().items) keys.emplace_back(key);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    const TString& s = v.as_tstring();
    for (size_t i = 0; i < s.text.size();) {
      size_t n = 1;
      while (i + n < s.text.size() && (static_cast<uint8_t>(s.text[i + n]) & 0xC0) == 0x80) ++n;
      chars.emplace_back(s.slice(i, i + n));
      i += n;
    }
    return chars;
  }
  throw TemplateError(std::string("'") + type_name(v) + "' object is not iterable");
}

bool any_tainted(const Value& v) {
  if (v.is_string()) return v.as_tstring().is_tainted();
  if (v.is_list()) {
    for (const Value& item : v.as_list()) {
      if (any_tainted(item)) return true;
    }
  }
  if (v.is_dict()) {
    for (const auto& [key, item] : v.as_dict().items) {
      if (any_tainted(item)) return true;
    }
  }
  return false;
}

// Jinja's attribute path lookup for selectattr/map/sort: "a.b.0".
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t begin = 0;
  while (begin <= path.size()) {
    const size_t dot = std::min(path.find('.', begin), path.size());
    const std::string part = path.substr(begin, dot - begin);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      v = get_item(v, Value(static_cast<int64_t>(std::stoll(part))));
    } else {
      v = v.is_undefined() ? v : get_item(v, Value(part));
    }
    begin = dot + 1;
  }
  return v;
}

Value sorted(List items, bool reverse, bool case_sensitive, const std::string& attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute.empty() ? v : attribute_path(v, attribute);
    if (!case_sensitive && k.is_string()) return Value(ascii_lower(k.as_string()));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? compare(key(b), key(a)) < 0 : compare(key(a), key(b)) < 0;
  });
  return Value::list(std::move(items));
}

// select/reject/selectattr/rejectattr: (attribute,) test name, test args...
Value select_items(const Value& input, Args& args, bool with_attribute, bool keep) {
  std::vector<Value> rest = std::move(args.positional);
  args.positional.clear();
  args.keyword.clear();
  size_t next = 0;
  std::string attribute;
  if (with_attribute) {
    if (rest.empty()) throw TemplateError("selectattr/rejectattr need an attribute");
    attribute = string_arg(rest[next++], "selectattr").text;
  }
  std::string test = "truthy";
  if (next < rest.size()) test = string_arg(rest[next++], "select").text;
  Args test_args;
  test_args.positional.assign(rest.begin() + static_cast<std::ptrdiff_t>(next), rest.end());
  List out;
  for (const Value& item : iterate(input)) {
    const Value subject = with_attribute ? attribute_path(item, attribute) : item;
    Args call = test_args;
    const bool passed = test == "truthy" ? subject.truthy() : apply_test(test, subject, call);
    if (passed == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value map_items(const Value& input, Args& args) {
  List out;
  const Value attribute = args.take(99, "attribute");
  if (!attribute.is_undefined()) {
    const Value fallback = args.take(99, "default");
    for (const Value& item : iterate(input)) {
      Value v = attribute_path(item, string_arg(attribute, "map").text);
      out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty()) throw TemplateError("map() needs a filter name or attribute=");
  const std::string filter = string_arg(args.positional[0], "map").text;
  Args filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keyword = args.keyword;
  args.positional.clear();
  args.keyword.clear();
  for (const Value& item : iterate(input)) {
    Args call = filter_args;
    out.push_back(apply_filter(filter, item, call));
  }
  return Value::list(std::move(out));
}

TString join(const Value& input, const TString& separator, const std::string& attribute) {
  TString out;
  bool first = true;
  for (const Value& item : iterate(input)) {
    if (!first) out.append(separator);
    first = false;
    out.append(to_tstring(attribute.empty() ? item : attribute_path(item, attribute)));
  }
  return out;
}

Value tojson(const Value& input, Args& args) {
  const Value indent = args.take(0, "indent");
  args.take(1, "ensure_ascii");  // transformers' default False is the only behaviour we render
  const Value separators = args.take(2, "separators");
  const bool sort_keys = bool_arg(args.take(3, "sort_keys"), false);
  const int width = indent.is_int() ? static_cast<int>(indent.as_int()) : -1;
  std::string item_sep = width >= 0 ? "," : ", ";
  std::string key_sep = ": ";
  if (separators.is_list() && separators.as_list().size() == 2) {
    item_sep = string_arg(separators.as_list()[0], "tojson").text;
    key_sep = string_arg(separators.as_list()[1], "tojson").text;
  }
  std::string json = to_json(input, width, item_sep, key_sep, sort_keys);
  return any_tainted(input) ? Value(TString::untrusted(std::move(json))) : Value(std::move(json));
}

Value indent_filter(const TString& s, Args& args) {
  const Value width_arg = args.take(0, "width");
  const std::string pad =
      width_arg.is_string()
          ? width_arg.as_string()
          : std::string(static_cast<size_t>(int_arg(width_arg, 4, "indent")), ' ');
  const bool first = bool_arg(args.take(1, "first"), false);
  const bool blank = bool_arg(args.take(2, "blank"), false);
  TString out;
  size_t begin = 0;
  bool first_line = true;
  while (begin <= s.text.size()) {
    size_t end = s.text.find('\n', begin);
    const bool last = end == std::string::npos;
    if (last) end = s.text.size();
    const bool empty_line = end == begin;
    if ((!first_line || first) && (blank || !empty_line)) out.append(pad);
    out.append(s.slice(begin, end));
    if (last) break;
    out.append(s.slice(end, end + 1));
    begin = end + 1;
    first_line = false;
  }
  return Value(std::move(out));
}

Value dictsort(const Value& input, Args& args) {
  if (!input.is_dict()) throw TemplateError("dictsort expects a dict");
  const bool case_sensitive = bool_arg(args.take(0, "case_sensitive"), false);
  const Value by = args.take(1, "by");
  const bool reverse = bool_arg(args.take(2, "reverse"), false);
  const bool by_value = by.is_string() && by.as_string() == "value";
  List items;
  for (const auto& [key, item] : input.as_dict().items) {
    items.push_back(Value::list({Value(key), item}, true));
  }
  return sorted(std::move(items), reverse, case_sensitive, by_value ? "1" : "0");
}

Value round_filter(const Value& input, Args& args) {
  const int64_t precision = int_arg(args.take(0, "precision"), 0, "round");
  const Value method_arg = args.take(1, "method");
  const std::string method = method_arg.is_string() ? method_arg.as_string() : "common";
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = input.as_number() * scale;
  // Python's round() rounds half to even, as nearbyint does in the default rounding mode.
  const double r = method == "ceil"    ? std::ceil(x)
                   : method == "floor" ? std::floor(x)
                                       : std::nearbyint(x);
  return Value(r / scale);
}

Value number_filter(const Value& input, Args& args, bool to_int) {
  const Value fallback = args.take(0, "default");
  args.take(1, "base");
  try {
    if (input.is_string()) {
      const std::string s = python_strip(input.as_string());
      size_t used = 0;
      if (to_int) {
        const double d = std::stod(s, &used);
        if (used == s.size()) return Value(static_cast<int64_t>(d));
      } else {
        const double d = std::stod(s, &used);
        if (used == s.size()) return Value(d);
      }
    } else if (input.is_number() || input.is_bool()) {
      return to_int ? Value(static_cast<int64_t>(input.as_number())) : Value(input.as_number());
    }
  } catch (const std::exception&) {
  }
  if (!fallback.is_undefined()) return fallback;
  return to_int ? Value(int64_t{0}) : Value(0.0);
}

Value reduce(const Value& input, bool take_min) {
  List items = iterate(input);
  if (items.empty()) return Value::undefined("min/max of an empty sequence");
  Value best = items[0];
  for (const Value& v : items) {
    if ((take_min && compare(v, best) < 0) || (!take_min && compare(v, best) > 0)) best = v;
  }
  return best;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& input, Args& args) {
  Value out;
  if (name == "tojson") {
    out = tojson(input, args);
  } else if (name == "trim") {
    const Value chars = args.take(0, "chars");
    out = python_strip_tstring(to_tstring(input), chars, true, true);
  } else if (name == "length" || name == "count") {
    out = Value(input.is_undefined() ? int64_t{0} : input.length());
  } else if (name == "string") {
    out = Value(to_tstring(input));
  } else if (name == "default" || name == "d") {
    const Value fallback = args.take(0, "default_value");
    const bool boolean = bool_arg(args.take(1, "boolean"), false);
    const bool use_fallback = input.is_undefined() || (boolean && !input.truthy());
    out = use_fallback ? (fallback.is_undefined() ? Value("") : fallback) : input;
  } else if (name == "join") {
    const Value sep = args.take(0, "d");
    const Value attribute = args.take(1, "attribute");
    out = join(input, sep.is_undefined() ? TString() : to_tstring(sep),
               attribute.is_undefined() ? std::string() : to_tstring(attribute).text);
  } else if (name == "items") {
    if (input.is_undefined()) return Value::list({});
    if (!input.is_dict()) throw TemplateError("items filter expects a dict");
    List items;
    for (const auto& [key, item] : input.as_dict().items) {
      items.push_back(Value::list({Value(key), item}, true));
    }
    out = Value::list(std::move(items));
  } else if (name == "upper" || name == "lower") {
    const TString& s = to_tstring(input);
    out = Value(s.derived(name == "upper" ? ascii_upper(s.text) : ascii_lower(s.text)));
  } else if (name == "capitalize") {
    const TString& s = to_tstring(input);
    out = Value(s.derived(python_capitalize(s.text)));
  } else if (name == "title") {
    const TString& s = to_tstring(input);
    out = Value(s.derived(jinja_title(s.text)));
  } else if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    // Autoescape is off in transformers' environment, so output is never escaped implicitly; the
    // escape filters still HTML-escape, and safe is the identity.
    out = name == "safe" ? input
                         : Value(to_tstring(input).derived(html_escape(to_tstring(input).text)));
  } else if (name == "dictsort") {
    out = dictsort(input, args);
  } else if (name == "list") {
    out = Value::list(iterate(input));
  } else if (name == "replace") {
    const TString& s = to_tstring(input);
    const std::string old_text = string_arg(args.take(0, "old"), "replace").text;
    const TString& new_text = to_tstring(args.take(1, "new"));
    const int64_t count = int_arg(args.take(2, "count"), -1, "replace");
    TString r = python_replace(s.text, old_text, new_text.text, count);
    out = Value((s.is_tainted() || new_text.is_tainted()) ? TString::untrusted(r.text) : r);
  } else if (name == "selectattr" || name == "rejectattr") {
    out = select_items(input, args, true, name == "selectattr");
  } else if (name == "select" || name == "reject") {
    out = select_items(input, args, false, name == "select");
  } else if (name == "map") {
    out = map_items(input, args);
  } else if (name == "indent") {
    out = indent_filter(to_tstring(input), args);
  } else if (name == "first" || name == "last") {
    const List items = iterate(input);
    out = items.empty() ? Value::undefined("first/last of an empty sequence")
                        : (name == "first" ? items.front() : items.back());
  } else if (name == "int" || name == "float") {
    out = number_filter(input, args, name == "int");
  } else if (name == "abs") {
    out = input.is_int() ? Value(static_cast<int64_t>(std::llabs(input.as_int())))
                         : Value(std::fabs(input.as_number()));
  } else if (name == "round") {
    out = round_filter(input, args);
  } else if (name == "sum") {
    const Value attribute = args.take(0, "attribute");
    Value total = args.take(1, "start");
    if (total.is_undefined()) total = Value(int64_t{0});
    for (const Value& item : iterate(input)) {
      const Value v = attribute.is_undefined() ? item : attribute_path(item, attribute.as_string());
      total = total.is_int() && v.is_int() ? Value(total.as_int() + v.as_int())
                                           : Value(total.as_number() + v.as_number());
    }
    out = total;
  } else if (name == "min" || name == "max") {
    out = reduce(input, name == "min");
  } else if (name == "unique") {
    List unique;
    for (const Value& v : iterate(input)) {
      if (std::none_of(unique.begin(), unique.end(),
                       [&](const Value& u) { return equals(u, v); })) {
        unique.push_back(v);
      }
    }
    out = Value::list(std::move(unique));
  } else if (name == "sort") {
    const bool reverse = bool_arg(args.take(0, "reverse"), false);
    const bool case_sensitive = bool_arg(args.take(1, "case_sensitive"), false);
    const Value attribute = args.take(2, "attribute");
    out = sorted(iterate(input), reverse, case_sensitive,
                 attribute.is_undefined() ? std::string() : attribute.as_string());
  } else if (name == "reverse") {
    if (input.is_string()) {
      List chars = iterate(input);
      TString r;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) r.append(it->as_tstring());
      out = Value(std::move(r));
    } else {
      List items = iterate(input);
      std::reverse(items.begin(), items.end());
      out = Value::list(std::move(items));
    }
  } else if (name == "wordcount") {
    out = Value(static_cast<int64_t>(python_split(to_tstring(input), Value(), -1).size()));
  } else if (name == "format") {
    List items = args.positional;
    args.positional.clear();
    out = Value(percent_format(string_arg(input, "format"), Value::list(std::move(items), true)));
  } else if (name == "batch") {
    const int64_t size = int_arg(args.take(0, "linecount"), 1, "batch");
    List batches;
    List current;
    for (const Value& item : iterate(input)) {
      current.push_back(item);
      if (static_cast<int64_t>(current.size()) == size) {
        batches.push_back(Value::list(std::move(current)));
        current.clear();
      }
    }
    if (!current.empty()) batches.push_back(Value::list(std::move(current)));
    out = Value::list(std::move(batches));
  } else {
    throw TemplateError("no filter named '" + name + "'");
  }
  args.expect_consumed(name);
  return out;
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  auto arg = [&] { return args.take(0, "other"); };
  bool result;
  if (name == "defined") {
    result = !v.is_undefined();
  } else if (name == "undefined") {
    result = v.is_undefined();
  } else if (name == "none") {
    result = v.is_none();
  } else if (name == "boolean") {
    result = v.is_bool();
  } else if (name == "true" || name == "false") {
    result = v.is_bool() && v.as_bool() == (name == "true");
  } else if (name == "integer") {
    result = v.is_int();
  } else if (name == "float") {
    result = v.is_float();
  } else if (name == "number") {
    result = v.is_number() || v.is_bool();
  } else if (name == "string") {
    result = v.is_string();
  } else if (name == "mapping") {
    result = v.is_dict() && !v.as_dict().is_namespace;
  } else if (name == "iterable") {
    result = v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  } else if (name == "sequence") {
    result = v.is_list() || v.is_string() || v.is_undefined() ||
             (v.is_dict() && !v.as_dict().is_namespace);
  } else if (name == "callable") {
    result = v.is_callable();
  } else if (name == "sameas") {
    const Value other = arg();
    // Python identity: singletons and containers by identity; ints as CPython's cached small
    // ints (what templates compare with `is sameas`) by value.
    result = v.kind() == other.kind() &&
             (v.is_none() || v.is_undefined() || (v.is_bool() && v.as_bool() == other.as_bool()) ||
              (v.is_int() && v.as_int() == other.as_int()) ||
              (v.is_dict() && v.dict_ptr() == other.dict_ptr()));
  } else if (name == "eq" || name == "equalto" || name == "==") {
    result = equals(v, arg());
  } else if (name == "ne" || name == "!=") {
    result = !equals(v, arg());
  } else if (name == "lt" || name == "lessthan" || name == "<") {
    result = compare(v, arg()) < 0;
  } else if (name == "le" || name == "<=") {
    result = compare(v, arg()) <= 0;
  } else if (name == "gt" || name == "greaterthan" || name == ">") {
    result = compare(v, arg()) > 0;
  } else if (name == "ge" || name == ">=") {
    result = compare(v, arg()) >= 0;
  } else if (name == "in") {
    result = contains(args.take(0, "seq"), v);
  } else if (name == "even" || name == "odd") {
    result = (int_arg(v, 0, name.c_str()) % 2 != 0) == (name == "odd");
  } else if (name == "divisibleby") {
    const int64_t d = int_arg(args.take(0, "num"), 1, "divisibleby");
    result = d != 0 && v.as_int() % d == 0;
  } else if (name == "lower" || name == "upper") {
    const std::string& s = string_arg(v, name.c_str()).text;
    result = s == (name == "lower" ? ascii_lower(s) : ascii_upper(s));
  } else {
    throw TemplateError("no test named '" + name + "'");
  }
  args.expect_consumed(name);
  return result;
}

}  // namespace strata::tokenizer::jinja
