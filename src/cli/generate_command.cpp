// `strata generate`: one prompt in, streamed text out (or one JSON object with --json).

#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "loaded_model.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage =
    R"(usage: strata generate --model PATH (--prompt TEXT | --prompt-ids IDS) [options]

Runs one prompt through the engine and streams the continuation to stdout.

  --model PATH            GGUF file or HF model directory (config.json, *.safetensors, tokenizer.json)
  --prompt TEXT           prompt text (special tokens such as <|im_start|> are recognised)
  --prompt-ids IDS        comma-separated token ids instead of --prompt
  --chat                  wrap the prompt as a user message in the model's chat template
  --system TEXT           system message (with --chat)
  --max-tokens N          tokens to generate (default 128)
  --temperature T         0 = greedy (default 0)
  --top-p P, --top-k K, --min-p P        truncation (defaults off)
  --repetition-penalty R, --presence-penalty P, --frequency-penalty F   (defaults off)
  --seed N                sampling seed (default: random)
  --stop TEXT             stop string
  --ignore-eos            keep generating past end-of-sequence tokens (benchmarks)
  --json                  print one JSON object: prompt and generated token ids, text, timings
  --device D              cpu, cuda, cuda:N or auto (default auto)
  --dtype T               float32, bfloat16, float16 (default float32 on CPU, bfloat16 on GPU)
  --weights W             quantized (default: GGUF weights stay quantized on the CPU) or dequantize
  --threads N             CPU threads (default: libtorch's choice)
  --kv-cache-mib N        KV pool size (default: 90% of free GPU memory; 4 full contexts on CPU)
  --block-size N          tokens per KV block (default 16)
  --chat-template K       built-in template for a model without one: chatml, llama3, mistral
  --chat-template-file F  a Jinja chat template to use instead of the model's
  --config FILE           a deployment file (configs/default.yaml documents every key); the
                          flags above override it, and so does --set section.key=value
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
  std::set<std::string> value_flags = {"prompt", "prompt-ids", "system"};
  value_flags.insert(deployment_flag_names().begin(), deployment_flag_names().end());
  value_flags.insert(sampling_flag_names().begin(), sampling_flag_names().end());
  STRATA_ASSIGN_OR_RETURN(Flags flags,
                          Flags::parse(args, value_flags, {"chat", "json", "ignore-eos", "help"},
                                       deployment_repeated_flag_names()));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  if (flags.has("prompt") == flags.has("prompt-ids")) {
    return invalid_argument_error("give exactly one of --prompt and --prompt-ids");
  }
  STRATA_ASSIGN_OR_RETURN(sampling::SamplingParams params, parse_sampling(flags, 0.0, 128));
  STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig deployment, deployment_from_flags(flags));
  STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(deployment));
  engine::Engine& engine = *loaded.engine;
  const tokenizer::Tokenizer& tok = engine.tokenizer();

  engine::GenerateRequest request;
  if (flags.has("prompt-ids")) {
    STRATA_ASSIGN_OR_RETURN(request.prompt_token_ids, parse_ids(flags.get("prompt-ids", "")));
  } else {
    const std::string text = flags.get("prompt", "");
    if (flags.has("chat")) {
      if (!loaded.chat_template) return loaded.chat_template_error;
      std::vector<tokenizer::ChatMessage> messages;
      if (flags.has("system")) messages.push_back({"system", flags.get("system", "")});
      messages.push_back({"user", text});
      STRATA_ASSIGN_OR_RETURN(tokenizer::ChatPrompt prompt,
                              loaded.chat_template->render(messages, true));
      request.prompt_token_ids = tok.encode(prompt);
    } else {
      request.prompt_token_ids = tok.encode(text, tok.add_bos_by_default());
    }
  }
  request.sampling = params;
  const std::vector<TokenId> prompt = request.prompt_token_ids;

  const auto start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<engine::RequestStream> stream,
                          engine.submit(std::move(request)));
  const bool json_output = flags.has("json");
  std::vector<TokenId> generated;
  std::string text;
  engine::RequestOutput last;
  while (std::optional<engine::RequestOutput> out = stream->next()) {
    for (const engine::TokenOutput& t : out->tokens) generated.push_back(t.token);
    text += out->text;
    if (!json_output && !out->text.empty()) {
      std::fwrite(out->text.data(), 1, out->text.size(), stdout);
      std::fflush(stdout);
    }
    last = std::move(*out);
  }
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (last.finish_reason == engine::FinishReason::kError) {
    return internal_error("generation failed: " + last.error);
  }
  if (!json_output) {
    std::fputc('\n', stdout);
    return Status();
  }
  const engine::Usage& usage = last.usage;
  const double ttft_ms = usage.time_to_first_token_ms;
  const double decode_ms = total_ms - ttft_ms;
  const int64_t num_decoded = usage.completion_tokens - 1;
  nlohmann::json out = {
      {"prompt_token_ids", prompt},
      {"generated_token_ids", generated},
      {"text", text},
      {"finish_reason", engine::finish_reason_name(*last.finish_reason)},
      {"usage",
       {{"prompt_tokens", usage.prompt_tokens},
        {"cached_prompt_tokens", usage.cached_prompt_tokens},
        {"completion_tokens", usage.completion_tokens}}},
      {"timing",
       {{"prefill_ms", ttft_ms},
        {"decode_ms", decode_ms},
        {"prefill_tokens_per_s", usage.prompt_tokens / (ttft_ms / 1e3)},
        {"decode_tokens_per_s", num_decoded > 0 ? num_decoded / (decode_ms / 1e3) : 0.0}}},
      {"model",
       {{"path", deployment.model.path},
        {"device", executor::device_name(engine.executor().device())},
        {"dtype", dtype_name(engine.executor().dtype())}}},
  };
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  return Status();
}

}  // namespace

int run_generate(const std::vector<std::string>& args) { return exit_code("strata generate", generate(args)); }

}  // namespace strata::cli
