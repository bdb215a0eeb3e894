#include "loaded_model.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "sampling_defaults.h"
#include "strata/config/config_loader.h"
#include "strata/model/gguf_file.h"
#include "strata/model/model_source.h"
#include "strata/store/kv_store.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

// Flag shortcuts and the deployment keys they set; `suffix` is appended to the value.
struct FlagKey {
  const char* flag;
  const char* key;
  const char* suffix = "";
};
constexpr FlagKey kFlagKeys[] = {
    {"model", "model.path"},
    {"dtype", "model.dtype"},
    {"weights", "model.weights"},
    {"chat-template", "model.chat_template"},
    {"chat-template-file", "model.chat_template_file"},
    {"served-name", "model.served_name"},
    {"device", "devices.device"},
    {"threads", "devices.cpu_threads"},
    {"kv-cache-mib", "kv_cache.cache_bytes", "MiB"},
    {"block-size", "kv_cache.block_size_tokens"},
    {"max-num-seqs", "scheduler.max_num_seqs"},
    {"max-batched-tokens", "scheduler.max_num_batched_tokens"},
    {"host", "server.host"},
    {"grpc-port", "server.grpc_port"},
    {"http-port", "server.http_port"},
    {"grace-seconds", "server.shutdown_grace_seconds"},
};

std::optional<tokenizer::ChatTemplateKind> to_template_kind(config::ChatTemplateFallback f) {
  switch (f) {
    case config::ChatTemplateFallback::kNone: return std::nullopt;
    case config::ChatTemplateFallback::kChatML: return tokenizer::ChatTemplateKind::kChatML;
    case config::ChatTemplateFallback::kLlama3: return tokenizer::ChatTemplateKind::kLlama3;
    case config::ChatTemplateFallback::kMistral: return tokenizer::ChatTemplateKind::kMistral;
  }
  return std::nullopt;
}

// The deployment's sections, as they are, are what the engine and its modules take.
engine::EngineOptions engine_options(const config::DeploymentConfig& d) {
  engine::EngineOptions o;
  static_cast<executor::DevicesConfig&>(o.executor) = d.devices;
  static_cast<executor::KernelsConfig&>(o.executor) = d.executor;
  static_cast<executor::KvCacheConfig&>(o.executor) = d.kv_cache;
  o.executor.leankv = d.leankv;
  o.executor.freekv = d.freekv;
  o.executor.dtype = d.model.dtype;
  o.executor.weights = d.model.weights;
  o.scheduler = d.scheduler;
  o.kv_store = d.kv_store;
  return o;
}

}  // namespace

const std::set<std::string>& deployment_flag_names() {
  static const std::set<std::string> kNames = [] {
    std::set<std::string> names = {"config"};
    for (const FlagKey& fk : kFlagKeys) names.insert(fk.flag);
    return names;
  }();
  return kNames;
}

const std::set<std::string>& deployment_repeated_flag_names() {
  static const std::set<std::string> kNames = {"set"};
  return kNames;
}

StatusOr<config::DeploymentConfig> deployment_from_flags(const Flags& flags) {
  config::DeploymentConfig d;
  if (flags.has("config")) {
    STRATA_ASSIGN_OR_RETURN(d, config::load_config_file(flags.get("config", "")));
  }
  for (const FlagKey& fk : kFlagKeys) {
    if (!flags.has(fk.flag)) continue;
    Status status = config::apply_override(d, fk.key, flags.get(fk.flag, "") + fk.suffix);
    if (!status.ok()) {
      return invalid_argument_error("--" + std::string(fk.flag) + ": " + status.message());
    }
  }
  for (const std::string& assignment : flags.get_all("set")) {
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos) {
      return invalid_argument_error("--set " + assignment + ": expected section.key=value");
    }
    Status status =
        config::apply_override(d, assignment.substr(0, eq), assignment.substr(eq + 1));
    if (!status.ok()) return invalid_argument_error("--set " + assignment + ": " + status.message());
  }
  if (d.model.path.empty()) {
    return invalid_argument_error("model.path is required: pass --model PATH or --config FILE");
  }
  STRATA_RETURN_IF_ERROR(d.validate());
  return d;
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

StatusOr<std::unique_ptr<tokenizer::Tokenizer>> open_tokenizer(const model::ModelSource& source) {
  if (const model::GgufFile* gguf = source.gguf()) return tokenizer::Tokenizer::from_gguf(*gguf);
  return tokenizer::Tokenizer::from_tokenizer_json(source.tokenizer_json_path());
}

StatusOr<LoadedEngine> load_engine(const config::DeploymentConfig& deployment,
                                   dist::Communicator* group,
                                   std::function<void(const Status&)> on_group_failure) {
  if (deployment.devices.tensor_parallel_size > 1 && group == nullptr) {
    return unimplemented_error("devices.tensor_parallel_size " +
                               std::to_string(deployment.devices.tensor_parallel_size) +
                               ": only `strata serve` runs a tensor-parallel group");
  }
  if (const store::AdaptCacheConfig& codecs = deployment.kv_store.adaptcache;
      deployment.devices.tensor_parallel_size > 1 && deployment.kv_store.enabled() &&
      (codecs.enabled || codecs.fixed_codec != "none")) {
    return invalid_argument_error(
        "kv_store.adaptcache: the store's lossy codecs are not served with tensor parallelism; "
        "set kv_store.adaptcache false and kv_store.fixed_codec none (docs/tensor-parallelism.md)");
  }
  engine::EngineOptions options = engine_options(deployment);
  options.executor.group = group;
  options.executor.on_group_failure = std::move(on_group_failure);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelSource> source,
                          model::open_model_source(deployment.model.path));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, open_tokenizer(*source));
  LoadedEngine loaded;
  auto token_text = [&](std::optional<TokenId> id) {
    return id ? tok->token_bytes(*id) : std::string();
  };
  std::string template_source = tok->chat_template_source();
  if (const std::string& file = deployment.model.chat_template_file; !file.empty()) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) return not_found_error("model.chat_template_file: cannot read " + file);
    template_source = text.str();
  }
  StatusOr<tokenizer::ChatTemplate> chat = tokenizer::ChatTemplate::create(
      template_source, to_template_kind(deployment.model.chat_template), token_text(tok->bos_id()),
      token_text(tok->eos_id()));
  if (!chat.ok() && !deployment.model.chat_template_file.empty()) {
    return Status(chat.status().code(), "model.chat_template_file: " + chat.status().message());
  }
  if (chat.ok()) {
    loaded.chat_template = std::move(chat).value();
  } else {
    loaded.chat_template_error = chat.status();
  }
  STRATA_ASSIGN_OR_RETURN(
      const sampling::SamplingDefaults defaults,
      resolve_sampling_defaults(
          deployment.sampling, source->gguf(),
          std::filesystem::path(source->tokenizer_json_path()).parent_path().string()));
  loaded.sampling_defaults = defaults.params();
  STRATA_ASSIGN_OR_RETURN(loaded.engine,
                          engine::Engine::create(std::move(source), std::move(tok), options));
  return loaded;
}

Status serve_rank(const config::DeploymentConfig& deployment, dist::Communicator& group) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelSource> source,
                          model::open_model_source(deployment.model.path));
  executor::ExecutorOptions options = engine_options(deployment).executor;
  options.group = &group;
  return executor::serve_tensor_parallel_rank(*source, options, deployment.kv_store);
}

}  // namespace strata::cli
