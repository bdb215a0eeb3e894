// Values of the Jinja interpreter that renders chat templates (see docs/chat-templates.md).
//
// The data model is Python's, as Jinja2 sees it under transformers' ImmutableSandboxedEnvironment:
// undefined, None, bool, int (int64), float (double), str, list, tuple, dict (insertion-ordered,
// string keys), namespace (the one mutable mapping) and callables (filters bound as methods,
// macros, globals). Lists and dicts are shared by reference, as in Python.
//
// Strings carry taint: the byte ranges that came from untrusted input (message contents, tool
// schemas). Concatenation keeps ranges exact; any other transformation of a tainted string taints
// its whole result. The renderer hands the ranges to the tokenizer, which never turns tainted bytes
// into special tokens (no role spoofing).
//
// Errors inside the interpreter are thrown as TemplateError and become INVALID_ARGUMENT at the
// Template boundary (template.h): the evaluator is a deep recursive walk, and an exception keeps
// every node's code free of error plumbing. Nothing else in Strata throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::tokenizer::jinja {

class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// [begin, end) byte offsets into a string.
struct Span {
  uint32_t begin = 0;
  uint32_t end = 0;
};

// A string and the ranges of it that came from untrusted input (sorted, disjoint, non-empty).
struct TString {
  std::string text;
  std::vector<Span> tainted;

  TString() = default;
  TString(std::string t) : text(std::move(t)) {}  // NOLINT: implicit, trusted text
  static TString untrusted(std::string t);

  bool is_tainted() const { return !tainted.empty(); }
  void append(const TString& other);
  void append(std::string_view trusted) { text.append(trusted); }
  void append(const std::string& trusted) { text.append(trusted); }
  void append(const char* trusted) { text.append(trusted); }
  // `text` with the same taint as *this as a whole: fully tainted if any byte of *this is.
  TString derived(std::string t) const;
  // Bytes [begin, end) with their taint.
  TString slice(size_t begin, size_t end) const;
};

class Value;
struct Args;
using List = std::vector<Value>;
struct Dict;
using Callable = std::function<Value(Args& args)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  Value(bool b);                                    // NOLINT: implicit
  Value(int64_t i);                                 // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d);                                  // NOLINT
  Value(TString s);                                 // NOLINT
  Value(std::string s);                             // NOLINT: trusted
  Value(const char* s);                             // NOLINT: trusted
  static Value list(List items, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d);
  static Value callable(std::string name, Callable fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  // int or float as double (bools count as ints, as in Python).
  double as_number() const;
  const TString& as_tstring() const { return s_; }
  const std::string& as_string() const { return s_.text; }
  const List& as_list() const { return *list_; }
  List& mutable_list() { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& mutable_dict() { return *dict_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  const Callable& as_callable() const { return *fn_; }
  // The undefined variable's name, or the callable's.
  const std::string& name() const { return s_.text; }

  // Python truthiness (undefined is false).
  bool truthy() const;
  // Python len(); TemplateError for values without one.
  int64_t length() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  TString s_;  // string value; name of an undefined variable or a callable
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// Insertion-ordered string-keyed mapping (Python dict). `is_namespace` marks namespace() objects,
// the only mapping a template may assign into ({% set ns.x = ... %}).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

// Call arguments: positional then keyword, as written.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name` (keyword wins), consumed; undefined when absent.
  Value take(size_t index, std::string_view name);
  // TemplateError naming `function` when an argument was left unconsumed.
  void expect_consumed(std::string_view function) const;

 private:
  std::vector<bool> used_;
};

// Python str(): the text printed by {{ value }} and the `string` filter. Undefined prints as "".
// Taint is kept for strings and propagated to a container's rendering.
TString to_tstring(const Value& v);
// Python repr() of a value (strings quoted as Python quotes them).
std::string python_repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) as transformers' tojson calls
// it. indent < 0 means None. TemplateError for values JSON cannot hold.
std::string to_json(const Value& v, int indent, std::string_view item_separator,
                    std::string_view key_separator, bool sort_keys);
// Python repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string python_float_repr(double d);

// A value holding `json`, with every string in it marked untrusted when `untrusted`.
Value from_json(const nlohmann::ordered_json& json, bool untrusted);

// Python ==, and the ordering used by <, sort and dictsort (TemplateError for unordered types).
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);

// Python's names for a value's type, for error messages: "str", "int", "dict", ...
const char* type_name(const Value& v);

}  // namespace strata::tokenizer::jinja
