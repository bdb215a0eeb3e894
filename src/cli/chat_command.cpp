// `strata chat`: an interactive multi-turn conversation with a local model in the terminal.
// Each turn re-sends the whole conversation; the engine's prefix cache finds the KV of the
// earlier turns, so only the new tokens are prefilled.

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "loaded_model.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage: strata chat --model PATH [options]

Chat with a local model in the terminal. Type a message and press Enter; /reset starts a new
conversation, /exit (or Ctrl-D) quits.

  --model PATH            GGUF file or HF model directory
  --system TEXT           system message
  --max-tokens N          most tokens per answer (default 512)
  --temperature T         default 0.7; 0 = greedy
  --top-p P, --top-k K, --min-p P, --repetition-penalty R, --seed N, --stop TEXT
  --device, --dtype, --threads, --kv-cache-mib, --block-size, --chat-template
                          as for `strata generate`
)";

Status chat(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = {"system"};
  value_flags.insert(engine_flag_names().begin(), engine_flag_names().end());
  value_flags.insert(sampling_flag_names().begin(), sampling_flag_names().end());
  STRATA_ASSIGN_OR_RETURN(Flags flags, Flags::parse(args, value_flags, {"help", "ignore-eos"}));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  STRATA_ASSIGN_OR_RETURN(sampling::SamplingParams params, parse_sampling(flags, 0.7, 512));
  if (!flags.has("top-p")) params.top_p = 0.9;

  std::fprintf(stderr, "loading %s ...\n", flags.get("model", "").c_str());
  STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(flags));
  if (!loaded.chat_template) return loaded.chat_template_error;
  engine::Engine& engine = *loaded.engine;
  std::fprintf(stderr, "%s on %s (%s). /reset starts over, /exit quits.\n",
               engine.model_config().name.c_str(),
               executor::device_name(engine.executor().options().device).c_str(),
               executor::dtype_name(engine.executor().options().dtype));

  std::vector<tokenizer::ChatMessage> messages;
  if (flags.has("system")) messages.push_back({"system", flags.get("system", "")});
  const size_t num_fixed = messages.size();
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
    STRATA_ASSIGN_OR_RETURN(std::string text, loaded.chat_template->render(messages, true));
    engine::GenerateRequest request;
    request.prompt_token_ids =
        engine.tokenizer().encode(text, loaded.chat_template->encode_add_bos());
    request.sampling = params;
    StatusOr<std::shared_ptr<engine::RequestStream>> stream = engine.submit(std::move(request));
    if (!stream.ok()) {
      // Most likely the conversation outgrew the context window: say so and start over.
      std::fprintf(stderr, "[%s; conversation reset]\n", stream.status().to_string().c_str());
      messages.resize(num_fixed);
      continue;
    }
    std::string answer;
    engine::RequestOutput last;
    while (std::optional<engine::RequestOutput> out = (*stream)->next()) {
      answer += out->text;
      std::fwrite(out->text.data(), 1, out->text.size(), stdout);
      std::fflush(stdout);
      last = std::move(*out);
    }
    std::fputc('\n', stdout);
    if (last.finish_reason == engine::FinishReason::kError) {
      std::fprintf(stderr, "[error: %s; conversation reset]\n", last.error.c_str());
      messages.resize(num_fixed);
      continue;
    }
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
