#include "loaded_model.h"

namespace strata::cli {

const std::set<std::string>& model_flag_names() {
  static const std::set<std::string> kNames = {"model", "device", "dtype", "threads",
                                               "chat-template"};
  return kNames;
}

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

StatusOr<LoadedModel> load_model(const Flags& flags) {
  if (!flags.has("model")) return invalid_argument_error("--model PATH is required");
  LoadedModel m;
  STRATA_ASSIGN_OR_RETURN(m.source, model::open_model_source(flags.get("model", "")));
  if (const model::GgufFile* gguf = m.source->gguf()) {
    STRATA_ASSIGN_OR_RETURN(m.tokenizer, tokenizer::Tokenizer::from_gguf(*gguf));
  } else {
    STRATA_ASSIGN_OR_RETURN(m.tokenizer,
                            tokenizer::Tokenizer::from_tokenizer_json(m.source->tokenizer_json_path()));
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<tokenizer::ChatTemplateKind> fallback,
                          parse_template_kind(flags.get("chat-template", "")));
  StatusOr<tokenizer::ChatTemplate> chat =
      tokenizer::ChatTemplate::from_source(m.tokenizer->chat_template_source(), fallback);
  if (chat.ok()) {
    m.chat_template = std::move(chat).value();
  } else {
    m.chat_template_error = chat.status();
  }

  executor::ExecutorOptions options;
  STRATA_ASSIGN_OR_RETURN(options.device, executor::parse_device(flags.get("device", "auto")));
  const std::string default_dtype =
      options.device.kind == executor::DeviceKind::kCuda ? "bfloat16" : "float32";
  STRATA_ASSIGN_OR_RETURN(options.dtype, executor::parse_dtype(flags.get("dtype", default_dtype)));
  STRATA_ASSIGN_OR_RETURN(int64_t threads, flags.get_int("threads", 0));
  options.num_threads = static_cast<int>(threads);
  STRATA_ASSIGN_OR_RETURN(m.executor, executor::Executor::create(*m.source, options));
  return m;
}

}  // namespace strata::cli
