#include "strings.h"

#include <algorithm>
#include <vector>

#include "../utf8.h"

namespace strata::tokenizer::jinja {
namespace {

// Byte offsets of the code points of valid UTF-8 `s`, plus s.size().
std::vector<size_t> code_point_starts(std::string_view s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  starts.push_back(s.size());
  return starts;
}

char32_t code_point_at(std::string_view s, size_t pos) {
  size_t len = 0;
  return detail::decode_code_point(s, pos, &len);
}

}  // namespace

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string python_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z')
    out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

std::string jinja_title(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' ||
                           c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (separator) {
      out.push_back(c);
      word_start = true;
    } else {
      out += word_start ? ascii_upper(std::string(1, c)) : ascii_lower(std::string(1, c));
      word_start = false;
    }
  }
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string python_strip(std::string_view s) {
  return python_strip_tstring(TString(std::string(s)), Value(), true, true).text;
}

TString python_strip_tstring(const TString& s, const Value& chars, bool left, bool right) {
  const std::string& text = s.text;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace && !chars.is_string()) throw TemplateError("strip arg must be None or str");
  std::vector<char32_t> set;
  if (!whitespace) {
    const std::string& c = chars.as_string();
    for (size_t i : code_point_starts(c)) {
      if (i < c.size()) set.push_back(code_point_at(c, i));
    }
  }
  auto strip_it = [&](char32_t cp) {
    return whitespace ? detail::is_python_whitespace(cp)
                      : std::find(set.begin(), set.end(), cp) != set.end();
  };
  const std::vector<size_t> starts = code_point_starts(text);
  size_t first = 0;
  size_t last = starts.size() - 1;  // index into starts of the end
  if (left) {
    while (first < last && strip_it(code_point_at(text, starts[first]))) ++first;
  }
  if (right) {
    while (last > first && strip_it(code_point_at(text, starts[last - 1]))) --last;
  }
  return s.slice(starts[first], starts[last]);
}

List python_split(const TString& s, const Value& sep, int64_t maxsplit, bool from_right) {
  const std::string& text = s.text;
  std::vector<std::pair<size_t, size_t>> parts;  // [begin, end)
  if (sep.is_undefined() || sep.is_none()) {
    // Runs of whitespace separate; leading/trailing whitespace yields no empty parts. With
    // maxsplit, the remainder is kept as is past the whitespace that ended the last split.
    const std::vector<size_t> starts = code_point_starts(text);
    auto ws = [&](size_t k) {
      return detail::is_python_whitespace(code_point_at(text, starts[k]));
    };
    const size_t n = starts.size() - 1;
    if (!from_right) {
      size_t k = 0;
      while (true) {
        while (k < n && ws(k)) ++k;
        if (k == n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.emplace_back(starts[k], starts[n]);  // the remainder keeps trailing whitespace
          break;
        }
        size_t b = k;
        while (k < n && !ws(k)) ++k;
        parts.emplace_back(starts[b], starts[k]);
      }
    } else {
      size_t k = n;
      while (true) {
        while (k > 0 && ws(k - 1)) --k;
        if (k == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.emplace_back(starts[0], starts[k]);  // the remainder keeps leading whitespace
          break;
        }
        size_t e = k;
        while (k > 0 && !ws(k - 1)) --k;
        parts.emplace_back(starts[k], starts[e]);
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    if (!sep.is_string()) throw TemplateError("split separator must be str or None");
    const std::string& d = sep.as_string();
    if (d.empty()) throw TemplateError("empty separator");
    if (!from_right) {
      size_t b = 0;
      while (true) {
        const size_t at = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)
                              ? std::string::npos
                              : text.find(d, b);
        if (at == std::string::npos) {
          parts.emplace_back(b, text.size());
          break;
        }
        parts.emplace_back(b, at);
        b = at + d.size();
      }
    } else {
      size_t e = text.size();
      while (true) {
        size_t at = std::string::npos;
        if (!(maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) && e >= d.size()) {
          at = text.rfind(d, e - d.size());
        }
        if (at == std::string::npos) {
          parts.emplace_back(0, e);
          break;
        }
        parts.emplace_back(at + d.size(), e);
        e = at;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  List out;
  for (auto [b, e] : parts) out.emplace_back(s.slice(b, e));
  return out;
}

TString python_replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                       int64_t count) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end.
    const std::vector<size_t> starts = code_point_starts(s);
    for (size_t k = 0; k + 1 < starts.size(); ++k) {
      if (count < 0 || done < count) {
        out.append(new_text);
        ++done;
      }
      out.append(s.substr(starts[k], starts[k + 1] - starts[k]));
    }
    if (count < 0 || done < count) out.append(new_text);
    return TString(std::move(out));
  }
  while (count < 0 || done < count) {
    const size_t at = s.find(old_text, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos)).append(new_text);
    pos = at + old_text.size();
    ++done;
  }
  out.append(s.substr(pos));
  return TString(std::move(out));
}

bool contains(const Value& haystack, const Value& needle) {
  if (haystack.is_string()) {
    if (!needle.is_string()) {
      throw TemplateError(std::string("'in <string>' requires string as left operand, not ") +
                          type_name(needle));
    }
    return haystack.as_string().find(needle.as_string()) != std::string::npos;
  }
  if (haystack.is_list()) {
    return std::any_of(haystack.as_list().begin(), haystack.as_list().end(),
                       [&](const Value& v) { return equals(v, needle); });
  }
  if (haystack.is_dict()) {
    return needle.is_string() && haystack.as_dict().find(needle.as_string()) != nullptr;
  }
  if (haystack.is_undefined()) return false;
  throw TemplateError(std::string("argument of type '") + type_name(haystack) +
                      "' is not iterable");
}

}  // namespace strata::tokenizer::jinja
