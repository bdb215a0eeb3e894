#include "strata/server/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "api_keys.h"
#include "grpc_requests.h"
#include "request_ids.h"
#include "strata/model/model_config.h"
#include "strata/server/tenant.h"
#include "strata/tokenizer/tokenizer.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::server {
namespace {

namespace pb = ::strata::v1;
constexpr std::chrono::milliseconds kPollInterval{50};
// What a stream cancelled at the shutdown deadline gets to write its final message.
constexpr std::chrono::seconds kFinalMessageTime{5};
using Clock = std::chrono::steady_clock;
constexpr int32_t kDefaultMaxTokens = 256;
// Session ids are keys the server stores and journals: bounded.
constexpr size_t kMaxSessionIdBytes = 256;

// The one place a Status becomes a gRPC status.
grpc::Status to_grpc_status(const Status& status) {
  using grpc::StatusCode;
  auto code = StatusCode::UNKNOWN;
  switch (status.code()) {
    case strata::StatusCode::kOk: return grpc::Status::OK;
    case strata::StatusCode::kInvalidArgument: code = StatusCode::INVALID_ARGUMENT; break;
    case strata::StatusCode::kNotFound: code = StatusCode::NOT_FOUND; break;
    case strata::StatusCode::kOutOfRange: code = StatusCode::OUT_OF_RANGE; break;
    case strata::StatusCode::kFailedPrecondition: code = StatusCode::FAILED_PRECONDITION; break;
    case strata::StatusCode::kResourceExhausted: code = StatusCode::RESOURCE_EXHAUSTED; break;
    case strata::StatusCode::kDataLoss: code = StatusCode::DATA_LOSS; break;
    case strata::StatusCode::kUnimplemented: code = StatusCode::UNIMPLEMENTED; break;
    case strata::StatusCode::kUnavailable: code = StatusCode::UNAVAILABLE; break;
    case strata::StatusCode::kCancelled: code = StatusCode::CANCELLED; break;
    case strata::StatusCode::kDeadlineExceeded: code = StatusCode::DEADLINE_EXCEEDED; break;
    case strata::StatusCode::kInternal: code = StatusCode::INTERNAL; break;
  }
  return grpc::Status(code, status.message());
}

// `p` over `defaults` (the deployment's sampling defaults; max_tokens has its own default).
sampling::SamplingParams to_sampling(const pb::SamplingParams& p,
                                     const sampling::SamplingParams& defaults) {
  sampling::SamplingParams s = defaults;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  s.max_tokens = p.has_max_tokens() ? p.max_tokens() : kDefaultMaxTokens;
  if (p.has_seed()) s.seed = p.seed();
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.num_logprobs = p.logprobs();
  if (p.has_prompt_logprobs()) s.prompt_logprobs = p.prompt_logprobs();
  return s;
}

void set_logprobs(const engine::TokenOutput& token, pb::TokenLogprobs* out) {
  out->set_token_id(token.token);
  out->set_logprob(token.logprob);
  for (const sampling::TokenLogprob& alt : token.top_logprobs) {
    pb::TokenLogprob* a = out->add_top();
    a->set_token_id(alt.token);
    a->set_logprob(alt.logprob);
  }
}

pb::FinishReason to_proto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop: return pb::FINISH_REASON_STOP;
    case engine::FinishReason::kLength: return pb::FINISH_REASON_LENGTH;
    case engine::FinishReason::kAbort:
    case engine::FinishReason::kError: return pb::FINISH_REASON_ABORT;
  }
  return pb::FINISH_REASON_UNSPECIFIED;
}

// Sessions are per tenant: the same id under two API keys names two conversations.
std::string session_key(const std::string& tenant, const std::string& session_id) {
  return tenant + '\n' + session_id;
}

// The running requests by their public id (random_request_id: unguessable, unlike the engine's
// counter), each owned by the tenant that started it, so Abort reaches only a caller's own.
class RunningRequests {
 public:
  // The public id of a request `tenant` started; forget it with remove().
  std::string add(engine::RequestId id, const std::string& tenant) {
    std::string public_id = random_request_id("req-");
    std::scoped_lock lock(mutex_);
    by_id_.emplace(public_id, std::make_pair(id, tenant));
    return public_id;
  }
  void remove(const std::string& public_id) {
    std::scoped_lock lock(mutex_);
    by_id_.erase(public_id);
  }
  // The request `tenant` started under `public_id`, if it still runs.
  std::optional<engine::RequestId> find(const std::string& public_id,
                                        const std::string& tenant) const {
    std::scoped_lock lock(mutex_);
    auto it = by_id_.find(public_id);
    if (it == by_id_.end() || it->second.second != tenant) return std::nullopt;
    return it->second.first;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::pair<engine::RequestId, std::string>> by_id_;
};

class GenerationService final : public pb::Generation::Service {
 public:
  using Writer = grpc::internal::WriterInterface<pb::GenerateResponse>;

  GenerationService(engine::Engine& engine, std::optional<tokenizer::ChatTemplate> chat,
                    SessionStore& sessions, const GrpcServerOptions& options)
      : engine_(engine),
        chat_(std::move(chat)),
        sessions_(sessions),
        served_name_(options.served_name),
        api_keys_(options.api_keys),
        sampling_defaults_(options.sampling_defaults) {
    read_requests_from_wire_bytes();
  }

  // The methods below are routed by read_requests_from_wire_bytes(), not overrides of the
  // generated service's (which would parse the request with gRPC's own error).
  grpc::Status generate(grpc::ServerContext* context, const pb::GenerateRequest* request,
                        Writer* writer) {
    std::string tenant;
    if (grpc::Status auth = authorize(context, &tenant); !auth.ok()) return auth;
    engine::GenerateRequest r;
    r.tenant = tenant_salt(tenant, request->user());
    switch (request->input_case()) {
      case pb::GenerateRequest::kPrompt:
        if (request->prompt().empty()) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt: must not be empty");
        }
        r.prompt_token_ids = engine_.tokenizer().encode(
            request->prompt(), engine_.tokenizer().add_bos_by_default());
        break;
      case pb::GenerateRequest::kPromptTokenIds:
        r.prompt_token_ids.assign(request->prompt_token_ids().ids().begin(),
                                  request->prompt_token_ids().ids().end());
        break;
      default:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "input: set prompt or prompt_token_ids");
    }
    r.sampling = to_sampling(request->sampling(), sampling_defaults_);
    r.priority = request->priority();
    if (request->has_compress_kv()) r.compress_kv = request->compress_kv();
    r.kv_task = request->kv_task();
    std::string unused;
    return stream(context, std::move(r), tenant, "", writer, &unused);
  }

  grpc::Status chat(grpc::ServerContext* context, const pb::ChatRequest* request,
                    Writer* writer) {
    std::string tenant;
    if (grpc::Status auth = authorize(context, &tenant); !auth.ok()) return auth;
    if (!chat_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "the model has no chat template this server understands");
    }
    const bool in_session = !request->session_id().empty();
    if (in_session == (request->messages_size() > 0)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "give either messages, or session_id with message");
    }
    std::vector<tokenizer::ChatMessage> messages;
    tokenizer::ChatMessage turn;
    std::optional<SessionStore::TurnLease> lease;
    if (in_session) {
      if (request->session_id().size() > kMaxSessionIdBytes) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "session_id: at most " + std::to_string(kMaxSessionIdBytes) +
                                " bytes, got " + std::to_string(request->session_id().size()));
      }
      if (request->message().content().empty()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "message.content: must not be empty");
      }
      if (auto leased = sessions_.lease_turn(session_key(tenant, request->session_id()))) {
        lease.emplace(std::move(*leased));
      } else {
        return grpc::Status(grpc::StatusCode::ABORTED,
                            "session_id: a turn of this session is still running; send the next "
                            "one when it has ended");
      }
      turn = {request->message().role().empty() ? "user" : request->message().role(),
              request->message().content()};
      messages = sessions_.begin_turn(session_key(tenant, request->session_id()), turn,
                                      request->system());
    } else {
      for (const pb::ChatMessage& m : request->messages()) messages.push_back({m.role(), m.content()});
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      const std::string& role = messages[i].role;
      if (role != "system" && role != "user" && role != "assistant") {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "messages[" + std::to_string(i) + "].role: '" + role +
                                "' is not system, user or assistant");
      }
    }
    StatusOr<tokenizer::ChatPrompt> prompt =
        chat_->render(messages, /*add_generation_prompt=*/true);
    if (!prompt.ok()) return to_grpc_status(prompt.status());
    engine::GenerateRequest r;
    r.tenant = tenant_salt(tenant, request->user());
    r.prompt_token_ids = engine_.tokenizer().encode(*prompt);
    r.sampling = to_sampling(request->sampling(), sampling_defaults_);
    r.priority = request->priority();
    if (request->has_compress_kv()) r.compress_kv = request->compress_kv();
    r.kv_task = request->kv_task();
    if (in_session) r.session = session_key(tenant, request->session_id());
    std::string reply;
    grpc::Status status =
        stream(context, std::move(r), tenant, request->session_id(), writer, &reply);
    if (status.ok() && in_session) {
      // The reply went out; a journal that cannot record it (a full disk) costs durability only.
      const Status kept = sessions_.commit_turn(session_key(tenant, request->session_id()), turn,
                                                reply, request->system());
      if (!kept.ok()) spdlog::warn("session {}: {}", request->session_id(), kept.message());
    }
    return status;
  }

  grpc::Status end_session(grpc::ServerContext* context, const pb::EndSessionRequest* request,
                           pb::EndSessionResponse* response) {
    std::string tenant;
    if (grpc::Status auth = authorize(context, &tenant); !auth.ok()) return auth;
    const std::string key = session_key(tenant, request->session_id());
    const bool had_kv = engine_.end_session(key);
    response->set_existed(sessions_.erase(key) || had_kv);
    return grpc::Status::OK;
  }

  // From now on, requests still running at `deadline` are cancelled and their streams finished.
  void set_cancel_deadline(Clock::time_point deadline) {
    cancel_deadline_.store(deadline.time_since_epoch().count());
  }

  grpc::Status abort_request(grpc::ServerContext* context, const pb::AbortRequest* request,
                             pb::AbortResponse* response) {
    std::string tenant;
    if (grpc::Status auth = authorize(context, &tenant); !auth.ok()) return auth;
    // Another tenant's request, one that ended and one that never was look alike: not found.
    const std::optional<engine::RequestId> id = running_.find(request->request_id(), tenant);
    if (id) engine_.cancel(*id);
    response->set_found(id.has_value());
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext* context, const pb::ModelInfoRequest*,
                            pb::ModelInfo* info) override {
    std::string tenant;
    if (grpc::Status auth = authorize(context, &tenant); !auth.ok()) return auth;
    const model::ModelConfig& c = engine_.model_config();
    const executor::Executor& ex = engine_.executor();
    info->set_name(served_name_);
    info->set_architecture(model::architecture_name(c.arch));
    info->set_vocab_size(static_cast<int32_t>(c.vocab_size));
    info->set_max_context_tokens(static_cast<int32_t>(c.max_context_tokens));
    info->set_num_layers(static_cast<int32_t>(c.num_layers));
    info->set_device(executor::device_name(ex.device()));
    info->set_dtype(dtype_name(ex.dtype()));
    info->set_kv_block_size_tokens(ex.kv_geometry().block_size_tokens);
    info->set_kv_blocks(ex.kv_geometry().num_blocks);
    return grpc::Status::OK;
  }

 private:
  // The methods that take strings get their request as wire bytes (see grpc_requests.h), so a
  // field that is not UTF-8 is an INVALID_ARGUMENT naming it. Method indices follow the proto.
  void read_requests_from_wire_bytes() {
    route_streaming<pb::GenerateRequest>(0, &GenerationService::generate);
    route_streaming<pb::ChatRequest>(1, &GenerationService::chat);
    route_unary<pb::EndSessionRequest, pb::EndSessionResponse>(2, &GenerationService::end_session);
    route_unary<pb::AbortRequest, pb::AbortResponse>(3, &GenerationService::abort_request);
  }

  template <class Request>
  void route_streaming(int index, grpc::Status (GenerationService::*method)(
                                      grpc::ServerContext*, const Request*, Writer*)) {
    using Call = grpc::ServerSplitStreamer<grpc::ByteBuffer, pb::GenerateResponse>;
    MarkMethodStreamed(
        index,
        new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, pb::GenerateResponse>(
            [this, method](grpc::ServerContext* context, Call* call) {
              Request request;
              if (grpc::Status read = read_request(*call, request); !read.ok()) return read;
              return (this->*method)(context, &request, call);
            }));
  }

  template <class Request, class Response>
  void route_unary(int index, grpc::Status (GenerationService::*method)(
                                  grpc::ServerContext*, const Request*, Response*)) {
    using Call = grpc::ServerUnaryStreamer<grpc::ByteBuffer, Response>;
    MarkMethodStreamed(
        index, new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, Response>(
                   [this, method](grpc::ServerContext* context, Call* call) {
                     Request request;
                     if (grpc::Status read = read_request(*call, request); !read.ok()) return read;
                     Response response;
                     grpc::Status status = (this->*method)(context, &request, &response);
                     if (status.ok()) call->Write(response);
                     return status;
                   }));
  }

  static grpc::Status read_request(grpc::internal::ReaderInterface<grpc::ByteBuffer>& call,
                                   google::protobuf::Message& request) {
    grpc::ByteBuffer raw;
    if (!call.Read(&raw)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: no message received");
    }
    std::vector<grpc::Slice> slices;
    if (!raw.Dump(&slices).ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: unreadable message");
    }
    std::string wire;
    for (const grpc::Slice& slice : slices) {
      wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    return to_grpc_status(parse_request(wire, request));
  }

  // With API keys configured, the call must carry "authorization: Bearer <key>"; the key is the
  // tenant. UNAUTHENTICATED otherwise.
  grpc::Status authorize(grpc::ServerContext* context, std::string* tenant) const {
    if (api_keys_.empty()) return grpc::Status::OK;
    const auto& metadata = context->client_metadata();
    auto it = metadata.find("authorization");
    if (it != metadata.end()) {
      if (std::optional<std::string> key =
              match_bearer(std::string_view(it->second.data(), it->second.size()), api_keys_)) {
        *tenant = std::move(*key);
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization: a valid \"Bearer <api key>\" is required");
  }

  // Submits the request and relays its deltas until it finishes, the client goes away (the
  // request is cancelled and its KV freed) or the deadline passes. Collects the reply text.
  grpc::Status stream(grpc::ServerContext* context, engine::GenerateRequest request,
                      const std::string& tenant, const std::string& session_id,
                      Writer* writer, std::string* reply) {
    StatusOr<std::shared_ptr<engine::RequestStream>> submitted = engine_.submit(std::move(request));
    if (!submitted.ok()) return to_grpc_status(submitted.status());
    engine::RequestStream& stream = **submitted;
    const std::string public_id = running_.add(stream.id(), tenant);
    struct Forget {
      RunningRequests& running;
      const std::string& id;
      ~Forget() { running.remove(id); }
    } forget{running_, public_id};
    bool first = true;
    bool draining = false;
    engine::RequestOutput out;
    while (true) {
      // Past the shutdown deadline the request is cancelled; its stream still ends with a final
      // message (finish reason ABORT, usage) before the server closes the call.
      if (!draining && Clock::now().time_since_epoch().count() >= cancel_deadline_.load()) {
        engine_.cancel(stream.id());
        draining = true;
      }
      const engine::RequestStream::Wait wait = stream.next_for(kPollInterval, &out);
      if (wait == engine::RequestStream::Wait::kEnd) return grpc::Status::OK;
      if (wait == engine::RequestStream::Wait::kTimeout) {
        if (context->IsCancelled()) return cancel(stream);
        continue;
      }
      if (out.finish_reason == engine::FinishReason::kError) {
        return grpc::Status(grpc::StatusCode::INTERNAL, out.error);
      }
      pb::GenerateResponse response;
      if (first) {
        response.set_request_id(public_id);
        response.set_session_id(session_id);
        first = false;
      }
      for (const engine::TokenOutput& t : out.tokens) {
        response.add_token_ids(t.token);
        set_logprobs(t, response.add_logprobs());
      }
      for (const engine::TokenOutput& t : out.prompt_logprobs) {
        set_logprobs(t, response.add_prompt_logprobs());
      }
      response.set_text(out.text);
      *reply += out.text;
      if (out.finish_reason) {
        response.set_finish_reason(to_proto(*out.finish_reason));
        pb::Usage* usage = response.mutable_usage();
        usage->set_prompt_tokens(static_cast<int32_t>(out.usage.prompt_tokens));
        usage->set_cached_prompt_tokens(static_cast<int32_t>(out.usage.cached_prompt_tokens));
        usage->set_cached_tier(out.usage.cached_tier);
        usage->set_completion_tokens(static_cast<int32_t>(out.usage.completion_tokens));
        usage->set_time_to_first_token_ms(out.usage.time_to_first_token_ms);
      }
      if (!writer->Write(response)) return cancel(stream);
    }
  }

  grpc::Status cancel(engine::RequestStream& stream) {
    engine_.cancel(stream.id());
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }

  engine::Engine& engine_;
  const std::optional<tokenizer::ChatTemplate> chat_;
  SessionStore& sessions_;
  const std::string served_name_;
  const std::vector<std::string> api_keys_;
  const sampling::SamplingParams sampling_defaults_;
  RunningRequests running_;
  // Clock::time_point::rep of the shutdown deadline; max until shutdown() starts.
  std::atomic<Clock::rep> cancel_deadline_{std::numeric_limits<Clock::rep>::max()};
};

}  // namespace

struct GrpcServer::Impl {
  std::unique_ptr<GenerationService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

GrpcServer::GrpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GrpcServer::~GrpcServer() { shutdown(std::chrono::milliseconds(0)); }

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::start(
    engine::Engine& engine, std::optional<tokenizer::ChatTemplate> chat_template,
    SessionStore& sessions, const GrpcServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->service =
      std::make_unique<GenerationService>(engine, std::move(chat_template), sessions, options);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.host + ":" + std::to_string(options.port),
                           grpc::InsecureServerCredentials(), &impl->port);
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    return Status(StatusCode::kUnavailable, "gRPC: cannot listen on " + options.host + ":" +
                                                std::to_string(options.port));
  }
  impl->server->GetHealthCheckService()->SetServingStatus(true);
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(impl)));
}

int GrpcServer::port() const { return impl_->port; }

void GrpcServer::shutdown(std::chrono::milliseconds grace) {
  if (!impl_ || !impl_->server) return;
  impl_->server->GetHealthCheckService()->SetServingStatus(false);
  // Requests still running after `grace` are cancelled by the service, which then writes their
  // final messages; gRPC closes the calls left after that.
  impl_->service->set_cancel_deadline(Clock::now() + grace);
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace + kFinalMessageTime);
  impl_->server->Wait();
  impl_->server.reset();
}

}  // namespace strata::server
