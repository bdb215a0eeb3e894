// JSON Schema -> Grammar (declared in grammar.h). Every rule below matches exactly the JSON texts
// that validate against the schema and are written compactly (no space except at most one after
// ':' and ','), so constrained output always parses and validates.
#include <nlohmann/json.hpp>

#include "strata/sampling/grammar.h"

namespace strata::sampling {
namespace {

using Json = nlohmann::ordered_json;
using Element = Grammar::Element;

// Compiles schemas into rules of one grammar. Errors are collected into status_.
class SchemaCompiler {
 public:
  SchemaCompiler(Grammar& g, const Json& root) : g_(g), root_(root) {}

  Status status() const { return status_; }

  int32_t value(const Json& schema, const std::string& at) {
    if (!status_.ok()) return any_value();
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return any_value();
      return fail(at, "the schema false accepts nothing");
    }
    if (!schema.is_object()) return fail(at, "a schema must be an object or a boolean");
    static const char* const kIgnored[] = {
        "description", "title",     "default",     "format",
        "examples",    "$schema",   "$id",         "$comment",
        "strict",      "$defs",     "definitions", "additionalProperties",
        "properties",  "required",  "items",       "prefixItems",
        "minItems",    "maxItems",  "type",        "enum",
        "const",       "anyOf",     "oneOf",       "allOf",
        "$ref",        "minLength", "maxLength",   "name",
        "nullable"};
    for (const auto& [key, unused] : schema.items()) {
      if (std::find(std::begin(kIgnored), std::end(kIgnored), key) == std::end(kIgnored)) {
        return fail(at + "." + key, "is not supported by structured outputs");
      }
    }
    if (schema.contains("$ref")) return reference(schema["$ref"], at);
    if (schema.contains("const")) return g_.literal(schema["const"].dump());
    if (schema.contains("enum")) {
      if (!schema["enum"].is_array() || schema["enum"].empty()) {
        return fail(at + ".enum", "must be a non-empty array");
      }
      const int32_t rule = g_.new_rule();
      for (const Json& option : schema["enum"]) {
        g_.add_alternative(rule, {g_.ref(g_.literal(option.dump()))});
      }
      return rule;
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!schema.contains(key)) continue;
      const Json& options = schema[key];
      if (!options.is_array() || options.empty())
        return fail(at + "." + key, "must be a non-empty array");
      if (std::string(key) == "allOf" && options.size() != 1) {
        return fail(at + ".allOf", "is supported with one schema only");
      }
      const int32_t rule = g_.new_rule();
      for (size_t i = 0; i < options.size(); ++i) {
        g_.add_alternative(
            rule, {g_.ref(value(options[i], at + "." + key + "[" + std::to_string(i) + "]"))});
      }
      return rule;
    }
    if (schema.contains("type")) {
      const Json& type = schema["type"];
      if (type.is_string()) return typed(type.get<std::string>(), schema, at);
      if (!type.is_array() || type.empty()) return fail(at + ".type", "must be a string or a list");
      const int32_t rule = g_.new_rule();
      for (const Json& t : type) {
        if (!t.is_string()) return fail(at + ".type", "must list type names");
        g_.add_alternative(rule, {g_.ref(typed(t.get<std::string>(), schema, at))});
      }
      return rule;
    }
    if (schema.contains("properties")) return object(schema, at);
    if (schema.contains("items") || schema.contains("prefixItems")) return array(schema, at);
    return any_value();
  }

  // Any JSON object.
  int32_t any_object() {
    if (any_object_ < 0) any_value();
    return any_object_;
  }

 private:
  int32_t fail(const std::string& at, const std::string& what) {
    if (status_.ok()) status_ = invalid_argument_error("response_format: " + at + " " + what);
    return any_value();
  }

  int32_t reference(const Json& ref, const std::string& at) {
    if (!ref.is_string()) return fail(at + ".$ref", "must be a string");
    const std::string target = ref.get<std::string>();
    auto it = refs_.find(target);
    if (it != refs_.end()) return it->second;
    const Json* schema = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p(prefix);
      if (target.rfind(p, 0) == 0) {
        const std::string name = target.substr(p.size());
        const std::string section = p.substr(2, p.size() - 3);
        if (root_.contains(section) && root_[section].contains(name)) {
          schema = &root_[section][name];
        }
      }
    }
    if (target == "#") schema = &root_;
    if (!schema)
      return fail(at + ".$ref", "'" + target + "' is not a #/$defs entry of this schema");
    // The rule exists before its body so recursive references resolve to it.
    const int32_t rule = g_.new_rule();
    refs_[target] = rule;
    g_.add_alternative(rule, {g_.ref(value(*schema, target))});
    return rule;
  }

  int32_t typed(const std::string& type, const Json& schema, const std::string& at) {
    if (type == "object") return object(schema, at);
    if (type == "array") return array(schema, at);
    if (type == "string") return string_rule(schema, at);
    if (type == "integer") return integer();
    if (type == "number") return number();
    if (type == "boolean") {
      const int32_t rule = g_.new_rule();
      g_.add_alternative(rule, {g_.ref(g_.literal("true"))});
      g_.add_alternative(rule, {g_.ref(g_.literal("false"))});
      return rule;
    }
    if (type == "null") return g_.literal("null");
    return fail(at + ".type", "'" + type + "' is not a JSON Schema type");
  }

  // " "? : the only whitespace we let the model write.
  Element space() {
    if (space_ < 0) {
      space_ = g_.new_rule();
      g_.add_alternative(space_, {});
      g_.add_alternative(space_, {g_.bytes(" ")});
    }
    return g_.ref(space_);
  }

  // `item` repeated between min and max times (max < 0: no limit), separated by `separator`.
  // Deterministic: after the first min items, a chain of optional (separator item) steps.
  int32_t repeat(int32_t item, int32_t separator, int64_t min, int64_t max) {
    int32_t rest = g_.new_rule();  // what may follow the first max(min, 1) items
    g_.add_alternative(rest, {});
    if (max < 0) {
      g_.add_alternative(rest, {g_.ref(separator), g_.ref(item), g_.ref(rest)});
    } else {
      for (int64_t j = std::max<int64_t>(min, 1); j < max; ++j) {
        const int32_t more = g_.new_rule();
        g_.add_alternative(more, {});
        g_.add_alternative(more, {g_.ref(separator), g_.ref(item), g_.ref(rest)});
        rest = more;
      }
    }
    return finish_repeat(item, separator, min, max, rest);
  }

  int32_t finish_repeat(int32_t item, int32_t separator, int64_t min, int64_t max, int32_t rest) {
    const int32_t rule = g_.new_rule();
    if (min == 0) g_.add_alternative(rule, {});
    if (max == 0) return rule;
    std::vector<Element> seq = {g_.ref(item)};
    for (int64_t i = 1; i < min; ++i) {
      seq.push_back(g_.ref(separator));
      seq.push_back(g_.ref(item));
    }
    seq.push_back(g_.ref(rest));
    g_.add_alternative(rule, std::move(seq));
    return rule;
  }

  int32_t comma() {
    if (comma_ < 0) {
      comma_ = g_.new_rule();
      g_.add_alternative(comma_, {g_.bytes(","), space()});
    }
    return comma_;
  }

  int32_t string_rule(const Json& schema, const std::string& at) {
    if (string_char_ < 0) {
      // A character of a JSON string: a printable ASCII byte but '"' and '\', a well-formed UTF-8
      // sequence (no overlongs, surrogates or code points past U+10FFFF), or an escape.
      string_char_ = g_.new_rule();
      g_.add_alternative(string_char_,
                         {g_.byte_ranges({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7F}})});
      const Element tail = g_.byte_range(0x80, 0xBF);
      g_.add_alternative(string_char_, {g_.byte_range(0xC2, 0xDF), tail});
      g_.add_alternative(string_char_, {g_.bytes("\xE0"), g_.byte_range(0xA0, 0xBF), tail});
      g_.add_alternative(string_char_, {g_.byte_ranges({{0xE1, 0xEC}, {0xEE, 0xEF}}), tail, tail});
      g_.add_alternative(string_char_, {g_.bytes("\xED"), g_.byte_range(0x80, 0x9F), tail});
      g_.add_alternative(string_char_, {g_.bytes("\xF0"), g_.byte_range(0x90, 0xBF), tail, tail});
      g_.add_alternative(string_char_, {g_.byte_range(0xF1, 0xF3), tail, tail, tail});
      g_.add_alternative(string_char_, {g_.bytes("\xF4"), g_.byte_range(0x80, 0x8F), tail, tail});
      g_.add_alternative(string_char_, {g_.bytes("\\"), g_.bytes("\"\\/bfnrt")});
      const Element hex = g_.bytes("0123456789abcdefABCDEF");
      g_.add_alternative(string_char_, {g_.bytes("\\"), g_.bytes("u"), hex, hex, hex, hex});
    }
    const int64_t min = schema.value("minLength", int64_t{0});
    const int64_t max = schema.value("maxLength", int64_t{-1});
    if (min < 0 || (max >= 0 && max < min) || max > 4096) {
      return fail(at + ".maxLength", "must be >= minLength and at most 4096");
    }
    const int32_t chars = repeat(string_char_, empty(), min, max);
    const int32_t rule = g_.new_rule();
    g_.add_alternative(rule, {g_.bytes("\""), g_.ref(chars), g_.bytes("\"")});
    return rule;
  }

  // '-'? ('0' | [1-9][0-9]{0,15}): at most 16 digits, so a model cannot loop on digits.
  int32_t integer() {
    if (integer_ >= 0) return integer_;
    const int32_t magnitude = g_.new_rule();
    g_.add_alternative(magnitude, {g_.bytes("0")});
    g_.add_alternative(magnitude, {g_.byte_range('1', '9'), g_.ref(digits(0, 15))});
    const int32_t sign = g_.new_rule();
    g_.add_alternative(sign, {});
    g_.add_alternative(sign, {g_.bytes("-")});
    integer_ = g_.new_rule();
    g_.add_alternative(integer_, {g_.ref(sign), g_.ref(magnitude)});
    return integer_;
  }

  // [0-9]{min,max}
  int32_t digits(int64_t min, int64_t max) {
    const int32_t digit = g_.new_rule();
    g_.add_alternative(digit, {g_.byte_range('0', '9')});
    return repeat(digit, empty(), min, max);
  }

  int32_t empty() {
    if (empty_ < 0) {
      empty_ = g_.new_rule();
      g_.add_alternative(empty_, {});
    }
    return empty_;
  }

  int32_t number() {
    if (number_ >= 0) return number_;
    const int32_t frac_digits = digits(1, 16);
    const int32_t fraction = g_.new_rule();
    g_.add_alternative(fraction, {});
    g_.add_alternative(fraction, {g_.bytes("."), g_.ref(frac_digits)});
    const int32_t exponent = g_.new_rule();
    g_.add_alternative(exponent, {});
    const int32_t exp_sign = g_.new_rule();
    g_.add_alternative(exp_sign, {});
    g_.add_alternative(exp_sign, {g_.bytes("+-")});
    g_.add_alternative(exponent, {g_.bytes("eE"), g_.ref(exp_sign), g_.ref(digits(1, 2))});
    number_ = g_.new_rule();
    g_.add_alternative(number_, {g_.ref(integer()), g_.ref(fraction), g_.ref(exponent)});
    return number_;
  }

  int32_t array(const Json& schema, const std::string& at) {
    const int64_t min = schema.value("minItems", int64_t{0});
    const int64_t max = schema.value("maxItems", int64_t{-1});
    if (min < 0 || (max >= 0 && max < min) || min > 1024 || max > 1024) {
      return fail(at + ".maxItems", "must be >= minItems, both at most 1024");
    }
    std::vector<Element> seq = {g_.bytes("[")};
    int64_t fixed = 0;
    if (schema.contains("prefixItems")) {
      const Json& prefix = schema["prefixItems"];
      if (!prefix.is_array()) return fail(at + ".prefixItems", "must be an array");
      for (size_t i = 0; i < prefix.size(); ++i) {
        if (i > 0) seq.push_back(g_.ref(comma()));
        seq.push_back(g_.ref(value(prefix[i], at + ".prefixItems[" + std::to_string(i) + "]")));
      }
      fixed = static_cast<int64_t>(prefix.size());
      if (min > fixed) return fail(at + ".minItems", "beyond prefixItems is not supported");
    }
    const Json items = schema.contains("items") ? schema["items"] : Json(fixed == 0);
    if (!(items.is_boolean() && !items.get<bool>())) {
      const int32_t item = value(items, at + ".items");
      const int64_t more_min = std::max<int64_t>(0, min - fixed);
      const int64_t more_max = max < 0 ? -1 : std::max<int64_t>(0, max - fixed);
      if (fixed == 0) {
        seq.push_back(g_.ref(repeat(item, comma(), more_min, more_max)));
      } else {
        // Further items after the prefix, each preceded by a comma.
        const int32_t entry = g_.new_rule();
        g_.add_alternative(entry, {g_.ref(comma()), g_.ref(item)});
        seq.push_back(g_.ref(repeat(entry, empty(), more_min, more_max)));
      }
    }
    seq.push_back(g_.bytes("]"));
    const int32_t rule = g_.new_rule();
    g_.add_alternative(rule, std::move(seq));
    return rule;
  }

  int32_t object(const Json& schema, const std::string& at) {
    const Json properties = schema.value("properties", Json::object());
    if (!properties.is_object()) return fail(at + ".properties", "must be an object");
    std::vector<std::string> required;
    for (const Json& r : schema.value("required", Json::array())) {
      if (!r.is_string()) return fail(at + ".required", "must list property names");
      required.push_back(r.get<std::string>());
      if (!properties.contains(required.back())) {
        return fail(at + ".required", "names '" + required.back() + "', which has no schema");
      }
    }
    if (properties.empty()) {
      // No declared properties: any object, unless additionalProperties is a schema for values.
      const Json additional = schema.value("additionalProperties", Json(true));
      if (additional.is_boolean()) return additional.get<bool>() ? any_object() : g_.literal("{}");
      const int32_t entry = g_.new_rule();
      g_.add_alternative(entry, {g_.ref(string_rule(Json::object(), at)), g_.bytes(":"), space(),
                                 g_.ref(value(additional, at + ".additionalProperties"))});
      const int32_t rule = g_.new_rule();
      g_.add_alternative(rule,
                         {g_.bytes("{"), g_.ref(repeat(entry, comma(), 0, -1)), g_.bytes("}")});
      return rule;
    }
    // The declared properties in their order, required ones always, optional ones maybe:
    // members(i, first) = the members from property i on, `first` if none was written yet.
    std::vector<int32_t> kv;
    std::vector<bool> is_required;
    for (const auto& [name, sub] : properties.items()) {
      const int32_t rule = g_.new_rule();
      g_.add_alternative(rule, {g_.ref(g_.literal(Json(name).dump())), g_.bytes(":"), space(),
                                g_.ref(value(sub, at + ".properties." + name))});
      kv.push_back(rule);
      is_required.push_back(std::find(required.begin(), required.end(), name) != required.end());
    }
    const size_t n = kv.size();
    std::vector<int32_t> members(2 * (n + 1));
    for (size_t i = n + 1; i-- > 0;) {
      for (int first = 0; first < 2; ++first) {
        const int32_t rule = g_.new_rule();
        members[2 * i + first] = rule;
        if (i == n) {
          g_.add_alternative(rule, {});
          continue;
        }
        std::vector<Element> take;
        if (!first) take.push_back(g_.ref(comma()));
        take.push_back(g_.ref(kv[i]));
        take.push_back(g_.ref(members[2 * (i + 1)]));
        g_.add_alternative(rule, std::move(take));
        if (!is_required[i]) g_.add_alternative(rule, {g_.ref(members[2 * (i + 1) + first])});
      }
    }
    const int32_t rule = g_.new_rule();
    g_.add_alternative(rule, {g_.bytes("{"), g_.ref(members[1]), g_.bytes("}")});
    return rule;
  }

  // Any JSON value (and, as a side effect, any object).
  int32_t any_value() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = g_.new_rule();
    any_object_ = g_.new_rule();
    const int32_t any_array = g_.new_rule();
    const int32_t str = string_rule(Json::object(), "");
    const int32_t entry = g_.new_rule();
    g_.add_alternative(entry, {g_.ref(str), g_.bytes(":"), space(), g_.ref(any_value_)});
    g_.add_alternative(any_object_,
                       {g_.bytes("{"), g_.ref(repeat(entry, comma(), 0, -1)), g_.bytes("}")});
    g_.add_alternative(any_array,
                       {g_.bytes("["), g_.ref(repeat(any_value_, comma(), 0, -1)), g_.bytes("]")});
    for (int32_t alt : {any_object_, any_array, str, number(), g_.literal("true"),
                        g_.literal("false"), g_.literal("null")}) {
      g_.add_alternative(any_value_, {g_.ref(alt)});
    }
    return any_value_;
  }

  Grammar& g_;
  const Json& root_;
  Status status_;
  std::unordered_map<std::string, int32_t> refs_;
  int32_t space_ = -1, comma_ = -1, empty_ = -1, string_char_ = -1, integer_ = -1, number_ = -1;
  int32_t any_value_ = -1, any_object_ = -1;
};

StatusOr<Json> parse_schema(std::string_view schema_json) {
  Json schema = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded())
    return invalid_argument_error("response_format: the schema is not JSON");
  return schema;
}

}  // namespace

StatusOr<std::shared_ptr<const Grammar>> Grammar::from_json_schema(
    std::string_view schema_json, std::shared_ptr<const TokenTable> tokens) {
  return wrapped_json_schema("", schema_json, "", std::move(tokens));
}

std::shared_ptr<const Grammar> Grammar::any_json_object(std::shared_ptr<const TokenTable> tokens) {
  auto g = std::make_shared<Grammar>(std::move(tokens));
  const Json root = Json::object();
  SchemaCompiler compiler(*g, root);
  g->set_root(compiler.any_object());
  return g;
}

StatusOr<std::shared_ptr<const Grammar>> Grammar::wrapped_json_schema(
    std::string_view prefix, std::string_view schema_json, std::string_view suffix,
    std::shared_ptr<const TokenTable> tokens) {
  STRATA_ASSIGN_OR_RETURN(Json schema, parse_schema(schema_json));
  auto g = std::make_shared<Grammar>(std::move(tokens));
  SchemaCompiler compiler(*g, schema);
  const int32_t body = compiler.value(schema, "json_schema.schema");
  STRATA_RETURN_IF_ERROR(compiler.status());
  const int32_t root = g->new_rule();
  g->add_alternative(root, {g->ref(g->literal(prefix)), g->ref(body), g->ref(g->literal(suffix))});
  g->set_root(root);
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace strata::sampling
