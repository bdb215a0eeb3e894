// Python string semantics the interpreter needs (str.strip/split/replace/capitalize, `in`), with
// taint kept exactly where the result is a slice of the input.
#pragma once

#include <string>
#include <string_view>

#include "value.h"

namespace strata::tokenizer::jinja {

std::string ascii_lower(std::string_view s);
std::string ascii_upper(std::string_view s);
// str.capitalize(): first character upper, the rest lower (ASCII letters).
std::string python_capitalize(std::string_view s);
// Jinja's title filter: each word (after '-', whitespace, '(', '{', '[', '<') capitalized.
std::string jinja_title(std::string_view s);
std::string html_escape(std::string_view s);

// str.strip() without arguments (Python whitespace).
std::string python_strip(std::string_view s);
// str.strip/lstrip/rstrip(chars): `chars` undefined or None strips Python whitespace.
TString python_strip_tstring(const TString& s, const Value& chars, bool left, bool right);
// str.split(sep, maxsplit) / str.rsplit: sep undefined or None splits on whitespace runs.
List python_split(const TString& s, const Value& sep, int64_t maxsplit, bool from_right = false);
// str.replace(old, new, count); count < 0 replaces all.
TString python_replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                       int64_t count);

// Python `needle in haystack` for strings (substring), lists (==) and dicts (keys).
bool contains(const Value& haystack, const Value& needle);

}  // namespace strata::tokenizer::jinja
