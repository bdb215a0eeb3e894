// Jinja2's built-in filters and tests, Python's str/dict/list methods, and the globals
// transformers adds (raise_exception, strftime_now, namespace, dict), with Python semantics.
#pragma once

#include <ctime>
#include <string>

#include "value.h"

namespace strata::tokenizer::jinja {

// `input | name(args)`. TemplateError for unknown filters and bad arguments.
Value apply_filter(const std::string& name, const Value& input, Args& args);
// `value is name(args)`.
bool apply_test(const std::string& name, const Value& value, Args& args);

// `object.name`: Python getattr then getitem, as Jinja2's environment.getattr. Methods of str,
// dict and list come back as callables bound to `object`; mutating methods are refused as the
// immutable sandbox refuses them. Missing attributes are undefined; attributes of undefined throw.
Value get_attribute(const Value& object, const std::string& name);
// `object[key]`: getitem then getattr. Negative list indices count from the end.
Value get_item(const Value& object, const Value& key);
// `object[start:stop:step]` for strings and lists (undefined parts are omitted ones).
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The template globals: range, namespace, dict, raise_exception and strftime_now, the last
// formatting `now` (local time) with C strftime.
Dict make_globals(std::time_t now);

// Python's `a % b` on strings (printf-style) and `'...'.format(...)`.
TString percent_format(const TString& format, const Value& args);

}  // namespace strata::tokenizer::jinja
