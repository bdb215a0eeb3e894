#include "loaded_model.h"

#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

StatusOr<std::optional<tokenizer::ChatTemplateKind>> parse_template_kind(const std::string& s) {
  if (s.empty()) return std::optional<tokenizer::ChatTemplateKind>();
  if (s == "chatml") return std::optional(tokenizer::ChatTemplateKind::kChatML);
  if (s == "llama3") return std::optional(tokenizer::ChatTemplateKind::kLlama3);
  if (s == "mistral") return std::optional(tokenizer::ChatTemplateKind::kMistral);
  return invalid_argument_error("--chat-template must be chatml, llama3 or mistral, got '" + s +
                                "'");
}

}  // namespace

const std::set<std::string>& engine_flag_names() {
  static const std::set<std::string> kNames = {
      "model", "device", "dtype", "threads", "chat-template", "kv-cache-mib", "block-size",
      "max-num-seqs", "max-batched-tokens"};
  return kNames;
}

const std::set<std::string>& sampling_flag_names() {
  static const std::set<std::string> kNames = {
      "temperature", "top-p", "top-k", "min-p", "repetition-penalty", "presence-penalty",
      "frequency-penalty", "seed", "max-tokens", "stop"};
  return kNames;
}

StatusOr<sampling::SamplingParams> parse_sampling(const Flags& flags, double default_temperature,
                                                  int64_t default_max_tokens) {
  sampling::SamplingParams p;
  STRATA_ASSIGN_OR_RETURN(p.temperature, flags.get_double("temperature", default_temperature));
  STRATA_ASSIGN_OR_RETURN(p.top_p, flags.get_double("top-p", 1.0));
  STRATA_ASSIGN_OR_RETURN(int64_t top_k, flags.get_int("top-k", 0));
  p.top_k = static_cast<int32_t>(top_k);
  STRATA_ASSIGN_OR_RETURN(p.min_p, flags.get_double("min-p", 0.0));
  STRATA_ASSIGN_OR_RETURN(p.repetition_penalty, flags.get_double("repetition-penalty", 1.0));
  STRATA_ASSIGN_OR_RETURN(p.presence_penalty, flags.get_double("presence-penalty", 0.0));
  STRATA_ASSIGN_OR_RETURN(p.frequency_penalty, flags.get_double("frequency-penalty", 0.0));
  STRATA_ASSIGN_OR_RETURN(p.max_tokens, flags.get_int("max-tokens", default_max_tokens));
  if (flags.has("seed")) {
    STRATA_ASSIGN_OR_RETURN(int64_t seed, flags.get_int("seed", 0));
    p.seed = static_cast<uint64_t>(seed);
  }
  if (flags.has("stop")) p.stop.push_back(flags.get("stop", ""));
  p.ignore_eos = flags.has("ignore-eos");
  return p;
}

StatusOr<LoadedEngine> load_engine(const Flags& flags) {
  if (!flags.has("model")) return invalid_argument_error("--model PATH is required");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelSource> source,
                          model::open_model_source(flags.get("model", "")));
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (const model::GgufFile* gguf = source->gguf()) {
    STRATA_ASSIGN_OR_RETURN(tok, tokenizer::Tokenizer::from_gguf(*gguf));
  } else {
    STRATA_ASSIGN_OR_RETURN(tok, tokenizer::Tokenizer::from_tokenizer_json(
                                     source->tokenizer_json_path()));
  }
  LoadedEngine loaded;
  STRATA_ASSIGN_OR_RETURN(std::optional<tokenizer::ChatTemplateKind> fallback,
                          parse_template_kind(flags.get("chat-template", "")));
  StatusOr<tokenizer::ChatTemplate> chat =
      tokenizer::ChatTemplate::from_source(tok->chat_template_source(), fallback);
  if (chat.ok()) {
    loaded.chat_template = std::move(chat).value();
  } else {
    loaded.chat_template_error = chat.status();
  }

  engine::EngineOptions options;
  STRATA_ASSIGN_OR_RETURN(options.executor.device,
                          executor::parse_device(flags.get("device", "auto")));
  const bool cuda = options.executor.device.kind == executor::DeviceKind::kCuda;
  STRATA_ASSIGN_OR_RETURN(options.executor.dtype,
                          executor::parse_dtype(flags.get("dtype", cuda ? "bfloat16" : "float32")));
  STRATA_ASSIGN_OR_RETURN(int64_t threads, flags.get_int("threads", 0));
  options.executor.num_threads = static_cast<int>(threads);
  STRATA_ASSIGN_OR_RETURN(int64_t kv_mib, flags.get_int("kv-cache-mib", 0));
  options.executor.kv_cache_bytes = kv_mib << 20;
  STRATA_ASSIGN_OR_RETURN(int64_t block_size, flags.get_int("block-size", 16));
  options.executor.kv_block_size_tokens = static_cast<int32_t>(block_size);
  STRATA_ASSIGN_OR_RETURN(int64_t max_seqs, flags.get_int("max-num-seqs", 64));
  options.scheduler.max_num_seqs = static_cast<int32_t>(max_seqs);
  STRATA_ASSIGN_OR_RETURN(options.scheduler.max_num_batched_tokens,
                          flags.get_int("max-batched-tokens", 512));
  STRATA_ASSIGN_OR_RETURN(loaded.engine,
                          engine::Engine::create(std::move(source), std::move(tok), options));
  return loaded;
}

}  // namespace strata::cli
