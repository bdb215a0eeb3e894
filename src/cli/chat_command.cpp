// `strata chat`: an interactive multi-turn chat in the terminal, either as a gRPC client of a
// running `strata serve` (a server-side session keeps the conversation, so each turn sends only
// the new message) or, with --model, against a local engine in this process.

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <functional>
#include <iostream>
#include <random>

#include "commands.h"
#include "loaded_model.h"
#include "strata/tokenizer/tokenizer.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage = R"(usage: strata chat [--server HOST:PORT | --model PATH] [options]

Chat in the terminal. Type a message and press Enter; /reset starts a new conversation, /exit
(or Ctrl-D) quits.

  --server HOST:PORT      a running `strata serve` (default 127.0.0.1:50051)
  --model PATH            instead, run the model locally in this process
  --config FILE           or locally as a deployment file describes
  --system TEXT           system message
  --max-tokens N          most tokens per answer (default 512)
  --temperature T         default 0.7; 0 = greedy
  --top-p P, --top-k K, --min-p P, --repetition-penalty R, --seed N, --stop TEXT
  --device, --dtype, --threads, --kv-cache-mib, --block-size, --chat-template,
  --chat-template-file
                          with --model, as for `strata generate`
)";

// One conversation backend: sends the conversation's next user message, streams the reply to
// `on_text`, and returns the reply.
class ChatBackend {
 public:
  virtual ~ChatBackend() = default;
  virtual StatusOr<std::string> turn(const std::string& message,
                                     const std::function<void(const std::string&)>& on_text) = 0;
  virtual void reset() = 0;
};

class RemoteChat final : public ChatBackend {
 public:
  RemoteChat(const std::string& address, sampling::SamplingParams params, std::string system)
      : stub_(v1::Generation::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        params_(std::move(params)), system_(std::move(system)) {
    reset();
  }

  StatusOr<std::string> turn(const std::string& message,
                             const std::function<void(const std::string&)>& on_text) override {
    v1::ChatRequest request;
    request.set_session_id(session_id_);
    request.set_system(system_);  // used when the server creates the session
    request.mutable_message()->set_role("user");
    request.mutable_message()->set_content(message);
    v1::SamplingParams* s = request.mutable_sampling();
    s->set_temperature(static_cast<float>(params_.temperature));
    s->set_top_p(static_cast<float>(params_.top_p));
    s->set_top_k(params_.top_k);
    s->set_min_p(static_cast<float>(params_.min_p));
    s->set_repetition_penalty(static_cast<float>(params_.repetition_penalty));
    s->set_max_tokens(static_cast<int32_t>(params_.max_tokens));
    if (params_.seed) s->set_seed(*params_.seed);
    for (const std::string& stop : params_.stop) s->add_stop(stop);
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->Chat(&context, request);
    std::string reply;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      reply += response.text();
      on_text(response.text());
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok()) {
      return Status(StatusCode::kUnavailable, "gRPC " + std::to_string(status.error_code()) +
                                                  ": " + status.error_message());
    }
    return reply;
  }

  void reset() override {
    if (!session_id_.empty()) {
      grpc::ClientContext context;
      v1::EndSessionRequest request;
      request.set_session_id(session_id_);
      v1::EndSessionResponse response;
      (void)stub_->EndSession(&context, request, &response);
    }
    std::random_device rd;
    session_id_ = "cli-" + std::to_string((uint64_t{rd()} << 32) | rd());
  }

 private:
  std::unique_ptr<v1::Generation::Stub> stub_;
  const sampling::SamplingParams params_;
  const std::string system_;
  std::string session_id_;
};

class LocalChat final : public ChatBackend {
 public:
  LocalChat(LoadedEngine loaded, sampling::SamplingParams params, std::string system)
      : loaded_(std::move(loaded)), params_(std::move(params)) {
    if (!system.empty()) fixed_.push_back({"system", std::move(system)});
    reset();
  }

  StatusOr<std::string> turn(const std::string& message,
                             const std::function<void(const std::string&)>& on_text) override {
    messages_.push_back({"user", message});
    StatusOr<std::string> reply = run(on_text);
    if (reply.ok()) {
      messages_.push_back({"assistant", *reply});
    } else {
      messages_.pop_back();
    }
    return reply;
  }

  void reset() override { messages_ = fixed_; }

 private:
  // Re-sends the whole conversation; the engine's prefix cache finds the earlier turns' KV.
  StatusOr<std::string> run(const std::function<void(const std::string&)>& on_text) {
    engine::Engine& engine = *loaded_.engine;
    STRATA_ASSIGN_OR_RETURN(tokenizer::ChatPrompt prompt,
                            loaded_.chat_template->render(messages_, true));
    engine::GenerateRequest request;
    request.prompt_token_ids = engine.tokenizer().encode(prompt);
    request.sampling = params_;
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<engine::RequestStream> stream,
                            engine.submit(std::move(request)));
    std::string reply;
    while (std::optional<engine::RequestOutput> out = stream->next()) {
      reply += out->text;
      on_text(out->text);
      if (out->finish_reason == engine::FinishReason::kError) return internal_error(out->error);
    }
    return reply;
  }

  LoadedEngine loaded_;
  const sampling::SamplingParams params_;
  std::vector<tokenizer::ChatMessage> fixed_;
  std::vector<tokenizer::ChatMessage> messages_;
};

Status chat(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = {"system", "server"};
  value_flags.insert(deployment_flag_names().begin(), deployment_flag_names().end());
  value_flags.insert(sampling_flag_names().begin(), sampling_flag_names().end());
  STRATA_ASSIGN_OR_RETURN(Flags flags, Flags::parse(args, value_flags, {"help", "ignore-eos"},
                                                    deployment_repeated_flag_names()));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  const bool local = flags.has("model") || flags.has("config");
  if (flags.has("server") && local) {
    return invalid_argument_error("give --server, or --model / --config, not both");
  }
  STRATA_ASSIGN_OR_RETURN(sampling::SamplingParams params, parse_sampling(flags, 0.7, 512));
  if (!flags.has("top-p")) params.top_p = 0.9;
  const std::string system = flags.get("system", "");

  std::unique_ptr<ChatBackend> backend;
  if (local) {
    STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig deployment, deployment_from_flags(flags));
    std::fprintf(stderr, "loading %s ...\n", deployment.model.path.c_str());
    STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(deployment));
    if (!loaded.chat_template) return loaded.chat_template_error;
    std::fprintf(stderr, "%s on %s (%s).", loaded.engine->model_config().name.c_str(),
                 executor::device_name(loaded.engine->executor().device()).c_str(),
                 dtype_name(loaded.engine->executor().dtype()));
    backend = std::make_unique<LocalChat>(std::move(loaded), params, system);
  } else {
    const std::string address = flags.get("server", "127.0.0.1:50051");
    std::fprintf(stderr, "connected to %s.", address.c_str());
    backend = std::make_unique<RemoteChat>(address, params, system);
  }
  std::fprintf(stderr, " /reset starts over, /exit quits.\n");

  std::string line;
  while (true) {
    std::fputs("\n> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      backend->reset();
      continue;
    }
    if (line.empty()) continue;
    StatusOr<std::string> reply = backend->turn(line, [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    if (!reply.ok()) {
      // Most likely the conversation outgrew the context window: say so and start over.
      std::fprintf(stderr, "[%s; conversation reset]\n", reply.status().to_string().c_str());
      backend->reset();
    }
  }
  return Status();
}

}  // namespace

int run_chat(const std::vector<std::string>& args) { return exit_code("strata chat", chat(args)); }

}  // namespace strata::cli
