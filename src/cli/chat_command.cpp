// `strata chat`: an interactive multi-turn conversation with a local model in the terminal.
// The conversation's KV cache is kept between turns, so each turn prefills only its new tokens.

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "generation_loop.h"
#include "loaded_model.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage: strata chat --model PATH [options]

Chat with a local model in the terminal. Type a message and press Enter; /reset starts a new
conversation, /exit (or Ctrl-D) quits.

  --model PATH           GGUF file or HF model directory
  --system TEXT          system message
  --max-tokens N         most tokens per answer (default 512)
  --temperature T        default 0.7; 0 = greedy
  --top-p P, --top-k K   defaults 0.9, 40
  --seed N               sampling seed (default 0)
  --device, --dtype, --threads, --chat-template   as for `strata generate`
)";

Status chat(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = {"system", "max-tokens", "temperature", "top-p", "top-k",
                                       "seed"};
  value_flags.insert(model_flag_names().begin(), model_flag_names().end());
  STRATA_ASSIGN_OR_RETURN(Flags flags, Flags::parse(args, value_flags, {"help"}));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  SamplingOptions sampling;
  STRATA_ASSIGN_OR_RETURN(sampling.temperature, flags.get_double("temperature", 0.7));
  STRATA_ASSIGN_OR_RETURN(sampling.top_p, flags.get_double("top-p", 0.9));
  STRATA_ASSIGN_OR_RETURN(sampling.top_k, flags.get_int("top-k", 40));
  STRATA_ASSIGN_OR_RETURN(int64_t seed, flags.get_int("seed", 0));
  sampling.seed = static_cast<uint64_t>(seed);
  STRATA_ASSIGN_OR_RETURN(int64_t max_tokens, flags.get_int("max-tokens", 512));
  if (max_tokens < 1) return invalid_argument_error("--max-tokens must be at least 1");

  std::fprintf(stderr, "loading %s ...\n", flags.get("model", "").c_str());
  STRATA_ASSIGN_OR_RETURN(LoadedModel m, load_model(flags));
  if (!m.chat_template) return m.chat_template_error;
  std::fprintf(stderr, "%s on %s (%s). /reset starts over, /exit quits.\n",
               m.source->config().name.c_str(),
               executor::device_name(m.executor->options().device).c_str(),
               executor::dtype_name(m.executor->options().dtype));

  std::vector<tokenizer::ChatMessage> messages;
  if (flags.has("system")) messages.push_back({"system", flags.get("system", "")});
  const size_t num_fixed = messages.size();
  GenerationLoop loop(*m.executor, *m.tokenizer, sampling);
  std::string line;
  while (true) {
    std::fputs("\n> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      messages.resize(num_fixed);
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    StatusOr<std::string> text = m.chat_template->render(messages, /*add_generation_prompt=*/true);
    if (!text.ok()) return text.status();
    std::string answer;
    StatusOr<GenerationResult> result =
        loop.run(m.tokenizer->encode(*text, m.chat_template->encode_add_bos()), max_tokens,
                 /*ignore_stop_tokens=*/false,
                 [&](const std::string& piece) {
                   answer += piece;
                   std::fwrite(piece.data(), 1, piece.size(), stdout);
                   std::fflush(stdout);
                 });
    if (!result.ok()) {
      // Most likely the conversation outgrew the context window: say so and start over.
      std::fprintf(stderr, "\n[%s; conversation reset]\n", result.status().to_string().c_str());
      messages.resize(num_fixed);
      continue;
    }
    std::fputc('\n', stdout);
    messages.push_back({"assistant", answer});
  }
  return Status();
}

}  // namespace

int run_chat(const std::vector<std::string>& args) {
  Status status = chat(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "strata chat: %s\n", status.to_string().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace strata::cli
