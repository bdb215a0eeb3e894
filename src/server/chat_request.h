// Private to the HTTP server: the chat-only fields of a /v1/chat/completions body (messages with
// their tool calls and tool results, tools, tool_choice, chat_template_kwargs).
#pragma once

#include "json_fields.h"
#include "openai_protocol.h"

namespace strata::server::openai {

// Fills out->messages, tools, tool_choice and chat_template_kwargs from `root`.
Status parse_chat_fields(const Json& root, ParsedRequest* out);

}  // namespace strata::server::openai
