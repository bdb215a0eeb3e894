// Strata gRPC streaming client: Generate for prompts, Chat (stateless: the whole history) for
// conversations.

#include <grpcpp/grpcpp.h>

#include "client_internal.h"
#include "strata/v1/generation.grpc.pb.h"

namespace strata::bench {

namespace {

class GrpcClient final : public BenchClient {
 public:
  GrpcClient(const ClientOptions& options, std::string target)
      : options_(options), target_(std::move(target)),
        stub_(v1::Generation::NewStub(
            grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()))) {}

  std::string describe() const override { return "grpc " + target_; }
  std::string model_id() const override { return model_; }

  Status probe() override {
    grpc::ClientContext context;
    prepare(context, 10);
    v1::ModelInfo info;
    const grpc::Status status = stub_->GetModelInfo(&context, v1::ModelInfoRequest(), &info);
    if (!status.ok()) {
      return Status(StatusCode::kUnavailable, "cannot reach a Strata gRPC server at " + target_ +
                                                  ": " + status.error_message());
    }
    model_ = options_.model.empty() ? info.name() : options_.model;
    return Status();
  }

  RequestResult send(const BenchRequest& request, bool ignore_eos) override {
    RequestResult result;
    result.prompt_len = request.prompt_len;
    v1::SamplingParams sampling;
    sampling.set_temperature(static_cast<float>(options_.temperature));
    sampling.set_max_tokens(static_cast<int32_t>(request.max_tokens));
    sampling.set_ignore_eos(ignore_eos);
    grpc::ClientContext context;
    prepare(context, options_.request_timeout_s);
    StreamTiming timing;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
    if (request.messages.empty()) {
      v1::GenerateRequest generate;
      generate.set_prompt(request.prompt);
      *generate.mutable_sampling() = sampling;
      generate.set_kv_task(request.kv_task);
      reader = stub_->Generate(&context, generate);
    } else {
      v1::ChatRequest chat;
      for (const Message& m : request.messages) {
        v1::ChatMessage* message = chat.add_messages();
        message->set_role(m.role);
        message->set_content(m.content);
      }
      *chat.mutable_sampling() = sampling;
      chat.set_kv_task(request.kv_task);
      reader = stub_->Chat(&context, chat);
    }
    v1::GenerateResponse response;
    v1::Usage usage;
    while (reader->Read(&response)) {
      if (response.token_ids_size() > 0) timing.on_chunk(response.text(), result);
      else result.generated_text += response.text();
      if (response.has_usage()) usage = response.usage();
    }
    const grpc::Status status = reader->Finish();
    timing.finish(result);
    if (!status.ok()) {
      result.error = "gRPC " + std::to_string(status.error_code()) + ": " + status.error_message();
      return result;
    }
    if (!timing.first_seen()) {
      result.error = "the stream ended without generated tokens";
      return result;
    }
    result.success = true;
    result.output_len = usage.completion_tokens();
    result.server_prompt_tokens = usage.prompt_tokens();
    result.cached_prompt_tokens = usage.cached_prompt_tokens();
    result.cached_tier = usage.cached_tier();
    return result;
  }

  StatusOr<std::vector<double>> score(const std::vector<TokenId>& prompt_token_ids,
                                      int64_t decode_tokens) override {
    if (decode_tokens > 0) {
      return unimplemented_error("scoring by decoding (--decode-tokens) runs in process only");
    }
    v1::GenerateRequest generate;
    generate.mutable_prompt_token_ids()->mutable_ids()->Assign(prompt_token_ids.begin(),
                                                               prompt_token_ids.end());
    v1::SamplingParams* sampling = generate.mutable_sampling();
    sampling->set_temperature(0);
    sampling->set_max_tokens(1);
    sampling->set_prompt_logprobs(0);
    grpc::ClientContext context;
    prepare(context, options_.request_timeout_s);
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->Generate(&context, generate);
    std::vector<double> logprobs;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      for (const v1::TokenLogprobs& t : response.prompt_logprobs()) logprobs.push_back(t.logprob());
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok()) {
      return internal_error("gRPC " + std::to_string(status.error_code()) + ": " +
                            status.error_message());
    }
    return logprobs;
  }

  std::optional<TierTokens> tier_hit_tokens() override {
    if (options_.metrics_url.empty()) return std::nullopt;
    return scrape_tier_hit_tokens(options_.metrics_url);
  }
  std::optional<Counters> store_counters() override {
    if (options_.metrics_url.empty()) return std::nullopt;
    return scrape_store_counters(options_.metrics_url);
  }

 private:
  void prepare(grpc::ClientContext& context, double timeout_s) const {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::duration<double>(timeout_s)));
    if (!options_.api_key.empty()) context.AddMetadata("authorization", "Bearer " + options_.api_key);
  }

  const ClientOptions options_;
  const std::string target_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::string model_;
};

}  // namespace

std::unique_ptr<BenchClient> make_grpc_client(const ClientOptions& options, std::string target) {
  return std::make_unique<GrpcClient>(options, std::move(target));
}

}  // namespace strata::bench
