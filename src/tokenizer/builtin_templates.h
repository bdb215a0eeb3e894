// The built-in chat templates for models that ship none: src/tokenizer/templates/<kind>.jinja,
// compiled in by CMake (builtin_templates.cpp in the build tree).
#pragma once

#include <string_view>

#include "strata/tokenizer/chat_template.h"

namespace strata::tokenizer {

std::string_view builtin_chat_template(ChatTemplateKind kind);

}  // namespace strata::tokenizer
