// The in-process client (`strata bench offline`) and the remote-client factory.

#include "client_internal.h"
#include "strata/engine/engine.h"
#include "strata/tokenizer/chat_template.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::bench {

namespace {

class EngineClient final : public BenchClient {
 public:
  EngineClient(engine::Engine& engine, const tokenizer::ChatTemplate* chat_template,
               std::string model_id, double temperature)
      : engine_(engine), chat_template_(chat_template), model_id_(std::move(model_id)),
        temperature_(temperature) {}

  std::string describe() const override { return "in-process engine (" + model_id_ + ")"; }
  std::string model_id() const override { return model_id_; }
  Status probe() override { return Status(); }

  RequestResult send(const BenchRequest& request, bool ignore_eos) override {
    RequestResult result;
    result.prompt_len = request.prompt_len;
    engine::GenerateRequest generate;
    StreamTiming timing;  // from here: tokenizing is part of serving, as it is for a server
    if (request.messages.empty()) {
      generate.prompt_token_ids =
          engine_.tokenizer().encode(request.prompt, engine_.tokenizer().add_bos_by_default());
    } else {
      if (chat_template_ == nullptr) {
        result.error = "the model has no chat template (set model.chat_template)";
        return result;
      }
      std::vector<tokenizer::ChatMessage> messages;
      for (const Message& m : request.messages) messages.push_back({m.role, m.content});
      StatusOr<tokenizer::ChatPrompt> prompt = chat_template_->render(messages, true);
      if (!prompt.ok()) {
        result.error = prompt.status().to_string();
        return result;
      }
      generate.prompt_token_ids = engine_.tokenizer().encode(*prompt);
    }
    generate.sampling.temperature = temperature_;
    generate.sampling.max_tokens = request.max_tokens;
    generate.sampling.ignore_eos = ignore_eos;
    generate.kv_task = request.kv_task;
    StatusOr<std::shared_ptr<engine::RequestStream>> stream = engine_.submit(std::move(generate));
    if (!stream.ok()) {
      timing.finish(result);
      result.error = stream.status().to_string();
      return result;
    }
    engine::Usage usage;
    std::optional<engine::FinishReason> finish;
    std::string error;
    while (std::optional<engine::RequestOutput> out = (*stream)->next()) {
      if (!out->tokens.empty()) timing.on_chunk(out->text, result);
      else result.generated_text += out->text;
      usage = out->usage;
      finish = out->finish_reason;
      error = out->error;
    }
    timing.finish(result);
    if (finish == engine::FinishReason::kError || finish == engine::FinishReason::kAbort) {
      result.error = std::string(engine::finish_reason_name(*finish)) + ": " + error;
      return result;
    }
    if (!timing.first_seen()) {
      result.error = "finished without generated tokens";
      return result;
    }
    result.success = true;
    result.output_len = usage.completion_tokens;
    result.server_prompt_tokens = usage.prompt_tokens;
    result.cached_prompt_tokens = usage.cached_prompt_tokens;
    result.cached_tier = usage.cached_tier;
    return result;
  }

  StatusOr<std::vector<double>> score(const std::vector<TokenId>& prompt_token_ids,
                                      int64_t decode_tokens) override {
    const int64_t n = static_cast<int64_t>(prompt_token_ids.size());
    if (decode_tokens < 0 || decode_tokens >= n) {
      return invalid_argument_error("decode_tokens " + std::to_string(decode_tokens) +
                                    " of a " + std::to_string(n) + "-token text");
    }
    engine::GenerateRequest generate;
    generate.prompt_token_ids.assign(prompt_token_ids.begin(),
                                     prompt_token_ids.end() - decode_tokens);
    generate.forced_completion.assign(prompt_token_ids.end() - decode_tokens,
                                      prompt_token_ids.end());
    generate.sampling.temperature = 0;
    generate.sampling.max_tokens = 1;
    generate.sampling.prompt_logprobs = 0;
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<engine::RequestStream> stream,
                            engine_.submit(std::move(generate)));
    std::vector<double> logprobs;
    std::optional<engine::FinishReason> finish;
    std::string error;
    while (std::optional<engine::RequestOutput> out = stream->next()) {
      for (const engine::TokenOutput& t : out->prompt_logprobs) logprobs.push_back(t.logprob);
      if (decode_tokens > 0) {
        for (const engine::TokenOutput& t : out->tokens) logprobs.push_back(t.logprob);
      }
      finish = out->finish_reason;
      error = out->error;
    }
    if (finish == engine::FinishReason::kError || finish == engine::FinishReason::kAbort) {
      return internal_error(std::string(engine::finish_reason_name(*finish)) + ": " + error);
    }
    return logprobs;
  }

  std::optional<TierTokens> tier_hit_tokens() override {
    const engine::EngineStats stats = engine_.stats();
    TierTokens tokens{{"gpu", static_cast<double>(stats.prefix_hit_tokens)}};
    if (stats.store) {
      for (const store::TierStats& t : stats.store->tiers) {
        tokens[t.name] = static_cast<double>(stats.loaded_tokens(t.name));
      }
    }
    return tokens;
  }

  std::optional<Counters> leankv_counters() override {
    const executor::LeanKvCounts c = engine_.stats().leankv;
    if (c.num_pages == 0) return std::nullopt;
    auto d = [](int64_t v) { return static_cast<double>(v); };
    return Counters{{"sequences", d(c.ended_sequences)}, {"high", d(c.ended_high)},
                    {"low", d(c.ended_low)},             {"pruned", d(c.ended_pruned)},
                    {"window", d(c.ended_window)},       {"bytes", d(c.ended_bytes)},
                    {"bf16_bytes", d(c.ended_bf16_bytes)}};
  }

  std::optional<Counters> freekv_counters() override {
    if (!engine_.executor().options().freekv.enabled) return std::nullopt;
    const executor::FreeKvCounts c = engine_.stats().freekv;
    auto d = [](int64_t v) { return static_cast<double>(v); };
    return Counters{{"steps", d(c.steps)},
                    {"refused_sequences", d(c.refused_sequences)},
                    {"head_steps", d(c.head_steps)},
                    {"corrected_heads", d(c.corrected_heads)},
                    {"recalled_pages", d(c.recalled_pages)},
                    {"reused_pages", d(c.reused_pages)},
                    {"recall_seconds", c.recall_seconds},
                    {"recall_exposed_seconds", c.recall_exposed_seconds}};
  }

  std::optional<Counters> store_counters() override {
    const engine::EngineStats stats = engine_.stats();
    if (!stats.store) return std::nullopt;
    const store::StoreStats& s = *stats.store;
    auto d = [](int64_t v) { return static_cast<double>(v); };
    Counters counters{{"prefetches", d(s.prefetches)},
                      {"direct_loads", d(s.direct_loads)},
                      {"saves_partial", d(s.saves_partial)},
                      {"saves_skipped", d(s.saves_skipped)},
                      {"corrupt_chunks", d(s.corrupt_chunks)},
                      {"transcodes", d(s.transcodes)},
                      {"load_failures", d(stats.store_load_failures)},
                      {"preemptions", d(stats.num_preemptions)},
                      {"partial_restores", d(stats.partial_restores)},
                      {"restore_history_token_layers", d(stats.restore_history_token_layers)},
                      {"restore_recomputed_token_layers", d(stats.restore_recomputed_token_layers)},
                      {"restore_pass_seconds", stats.restore_pass_seconds},
                      {"restore_wait_seconds", stats.restore_wait_seconds},
                      {"pair_maps", d(stats.pair_maps)},
                      {"paired_layers", d(stats.paired_layers)},
                      {"merged_chunks_loaded", d(stats.merged_chunks_loaded)},
                      {"suffix_turns", d(stats.suffix_turns)},
                      {"suffix_dropped_chunk_layers", d(stats.suffix_dropped_chunk_layers)},
                      {"suffix_recomputes", d(stats.suffix_recomputes)}};
    // Which codecs the store chose (AdaptCache's mix): re-encodings into each lossy codec.
    for (size_t c = 1; c < s.codec_names.size(); ++c) {
      counters["transcodes_" + s.codec_names[c]] = d(s.codec_transcodes[c]);
    }
    // What each tier holds at the end, as stored and before its codecs and suffixes.
    for (const store::TierStats& tier : s.tiers) {
      counters[tier.name + "_used_bytes"] = d(tier.used_bytes);
      counters[tier.name + "_raw_bytes"] = d(tier.raw_bytes);
      counters[tier.name + "_bytes_in"] = d(tier.bytes_in);
    }
    return counters;
  }

 private:
  engine::Engine& engine_;
  const tokenizer::ChatTemplate* chat_template_;
  const std::string model_id_;
  const double temperature_;
};

}  // namespace

std::unique_ptr<BenchClient> make_engine_client(engine::Engine& engine,
                                                const tokenizer::ChatTemplate* chat_template,
                                                std::string model_id, double temperature) {
  return std::make_unique<EngineClient>(engine, chat_template, std::move(model_id), temperature);
}

StatusOr<std::unique_ptr<BenchClient>> make_remote_client(const ClientOptions& options,
                                                          const tokenizer::Tokenizer& tokenizer) {
  if (options.backend == "openai" || options.backend == "openai-chat") {
    STRATA_ASSIGN_OR_RETURN(HttpUrl url, parse_http_url(options.base_url));
    return make_openai_client(options, std::move(url), tokenizer);
  }
  if (options.backend == "grpc") {
    std::string target = options.base_url;
    if (target.starts_with("grpc://")) target.erase(0, 7);
    if (target.empty() || target.find("://") != std::string::npos ||
        target.find(':') == std::string::npos) {
      return invalid_argument_error("--base-url for the grpc backend is HOST:PORT, got \"" +
                                    options.base_url + "\"");
    }
    return make_grpc_client(options, std::move(target));
  }
  return invalid_argument_error("--backend must be openai, openai-chat or grpc, got \"" +
                                options.backend + "\"");
}

}  // namespace strata::bench
