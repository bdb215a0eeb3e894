// A parsed Jinja template, rendered by our interpreter (no C++ Jinja library is packaged in Debian
// or PyPI). The environment is the one transformers' apply_chat_template uses: Jinja2's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls, the `generation`
// block, a tojson filter that calls json.dumps(ensure_ascii=False), and the globals
// raise_exception, strftime_now, namespace and dict. docs/chat-templates.md lists what is covered.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/common/status.h"
#include "value.h"

namespace strata::tokenizer::jinja {

struct Stmt;

// Immutable after parse(); render() is const and thread-safe.
class Template {
 public:
  // INVALID_ARGUMENT with the line for syntax errors and unsupported statements.
  static StatusOr<Template> parse(std::string_view source);

  // Renders with `variables` as the template's context. INVALID_ARGUMENT for errors raised while
  // rendering (raise_exception(), undefined attribute access, type errors), with their message.
  // `now` is what strftime_now() formats.
  StatusOr<TString> render(const std::vector<std::pair<std::string, Value>>& variables,
                           std::time_t now) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace strata::tokenizer::jinja
