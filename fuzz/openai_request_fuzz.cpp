// The OpenAI request decoder on arbitrary bodies, both endpoints. An accepted request has a valid
// shape: messages for chat, exactly one prompt form for completions.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using strata::server::openai::Endpoint;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Endpoint endpoint : {Endpoint::kChatCompletions, Endpoint::kCompletions}) {
    auto parsed = strata::server::openai::parse_request(endpoint, body, 49152);
    if (!parsed.ok()) {
      if (parsed.status().message().empty()) std::abort();  // errors always say what is wrong
      continue;
    }
    const bool shaped = endpoint == Endpoint::kChatCompletions
                            ? !parsed->messages.empty()
                            : parsed->prompt_text.has_value() != !parsed->prompt_token_ids.empty();
    if (!shaped) std::abort();
  }
  return 0;
}
