// `strata generate`: one prompt in, streamed text out (or one JSON object with --json).

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "generation_loop.h"
#include "loaded_model.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage: strata generate --model PATH (--prompt TEXT | --prompt-ids IDS) [options]

Runs one prompt through the model and streams the continuation to stdout.

  --model PATH           GGUF file or HF model directory (config.json, *.safetensors, tokenizer.json)
  --prompt TEXT          prompt text (special tokens such as <|im_start|> are recognised)
  --prompt-ids IDS       comma-separated token ids instead of --prompt
  --chat                 wrap the prompt as a user message in the model's chat template
  --system TEXT          system message (with --chat)
  --max-tokens N         tokens to generate (default 128)
  --temperature T        0 = greedy (default 0)
  --top-p P, --top-k K   nucleus / top-k sampling (defaults 1.0, off)
  --seed N               sampling seed (default 0)
  --ignore-eos           keep generating past stop tokens (benchmarks)
  --json                 print one JSON object: prompt and generated token ids, text, timings
  --device D             cpu, cuda, cuda:N or auto (default auto)
  --dtype T              float32, bfloat16, float16 (default float32 on CPU, bfloat16 on GPU)
  --threads N            CPU threads (default: libtorch's choice)
  --chat-template K      fallback template when the model's is unknown: chatml, llama3, mistral
)";

StatusOr<std::vector<TokenId>> parse_ids(const std::string& s) {
  std::vector<TokenId> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::out_of_range(item);
      ids.push_back(static_cast<TokenId>(v));
    } catch (const std::exception&) {
      return invalid_argument_error("--prompt-ids: '" + item + "' is not a token id");
    }
  }
  if (ids.empty()) return invalid_argument_error("--prompt-ids is empty");
  return ids;
}

Status generate(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = {"prompt", "prompt-ids", "system", "max-tokens",
                                       "temperature", "top-p", "top-k", "seed"};
  value_flags.insert(model_flag_names().begin(), model_flag_names().end());
  STRATA_ASSIGN_OR_RETURN(Flags flags,
                          Flags::parse(args, value_flags, {"chat", "json", "ignore-eos", "help"}));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  if (flags.has("prompt") == flags.has("prompt-ids")) {
    return invalid_argument_error("give exactly one of --prompt and --prompt-ids");
  }
  SamplingOptions sampling;
  STRATA_ASSIGN_OR_RETURN(sampling.temperature, flags.get_double("temperature", 0.0));
  STRATA_ASSIGN_OR_RETURN(sampling.top_p, flags.get_double("top-p", 1.0));
  STRATA_ASSIGN_OR_RETURN(sampling.top_k, flags.get_int("top-k", 0));
  STRATA_ASSIGN_OR_RETURN(int64_t seed, flags.get_int("seed", 0));
  sampling.seed = static_cast<uint64_t>(seed);
  STRATA_ASSIGN_OR_RETURN(int64_t max_tokens, flags.get_int("max-tokens", 128));
  if (max_tokens < 1) return invalid_argument_error("--max-tokens must be at least 1");
  if (sampling.temperature < 0) return invalid_argument_error("--temperature must be >= 0");
  if (!(sampling.top_p > 0 && sampling.top_p <= 1)) {
    return invalid_argument_error("--top-p must be in (0, 1]");
  }

  STRATA_ASSIGN_OR_RETURN(LoadedModel m, load_model(flags));
  std::vector<TokenId> prompt;
  if (flags.has("prompt-ids")) {
    STRATA_ASSIGN_OR_RETURN(prompt, parse_ids(flags.get("prompt-ids", "")));
  } else {
    std::string text = flags.get("prompt", "");
    bool add_bos = m.tokenizer->add_bos_by_default();
    if (flags.has("chat")) {
      if (!m.chat_template) return m.chat_template_error;
      std::vector<tokenizer::ChatMessage> messages;
      if (flags.has("system")) messages.push_back({"system", flags.get("system", "")});
      messages.push_back({"user", text});
      STRATA_ASSIGN_OR_RETURN(text, m.chat_template->render(messages, /*add_generation_prompt=*/true));
      add_bos = m.chat_template->encode_add_bos();
    }
    prompt = m.tokenizer->encode(text, add_bos);
  }
  if (prompt.empty()) return invalid_argument_error("the prompt encodes to no tokens");

  const bool json_output = flags.has("json");
  GenerationLoop loop(*m.executor, *m.tokenizer, sampling);
  STRATA_ASSIGN_OR_RETURN(
      GenerationResult result,
      loop.run(prompt, max_tokens, flags.has("ignore-eos"), [&](const std::string& text) {
        if (json_output || text.empty()) return;
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      }));
  if (!json_output) {
    std::fputc('\n', stdout);
    return Status();
  }
  std::vector<TokenId> shown = result.generated;
  if (result.finish_reason == FinishReason::kStop) shown.pop_back();
  const int64_t num_decoded = static_cast<int64_t>(result.generated.size()) - 1;
  nlohmann::json out = {
      {"prompt_token_ids", prompt},
      {"generated_token_ids", result.generated},
      {"text", m.tokenizer->decode(shown, /*skip_special=*/true)},
      {"finish_reason", finish_reason_name(result.finish_reason)},
      {"timing",
       {{"prefill_ms", result.prefill_ms},
        {"decode_ms", result.decode_ms},
        {"prefill_tokens_per_s", prompt.size() / (result.prefill_ms / 1e3)},
        {"decode_tokens_per_s",
         num_decoded > 0 ? num_decoded / (result.decode_ms / 1e3) : 0.0}}},
      {"model",
       {{"path", m.source->path()},
        {"device", executor::device_name(m.executor->options().device)},
        {"dtype", executor::dtype_name(m.executor->options().dtype)}}},
  };
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  return Status();
}

}  // namespace

int run_generate(const std::vector<std::string>& args) {
  Status status = generate(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "strata generate: %s\n", status.to_string().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace strata::cli
