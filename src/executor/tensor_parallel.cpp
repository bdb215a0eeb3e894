// Tensor parallelism: rank 0's executor, the plan on the wire, and the other ranks' loop
// (tensor_parallel.h).

#include "tensor_parallel.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/dist/communicator.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/model/model_source.h"
#include "torch_executor.h"

namespace strata::executor {
namespace {

enum class Message : uint8_t { kPass = 1, kPing = 2, kStop = 3 };

// How long rank 0 stays silent before it pings the others: well inside any collective timeout.
constexpr auto kPingInterval = std::chrono::seconds(1);

class Writer {
 public:
  template <typename T>
  void put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void bytes(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T get() {
    T value{};
    if (const char* p = take(sizeof(T))) std::memcpy(&value, p, sizeof(T));
    return value;
  }
  // n bytes, or null past the end (then ok() is false).
  const char* take(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return nullptr;
    }
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  bool good() const { return ok_; }                         // nothing read past the end
  bool ok() const { return ok_ && pos_ == in_.size(); }     // and everything read

 private:
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// The batch's plan (its loads' bytes, chunk_bytes each, included); INVALID_ARGUMENT for what
// tensor parallelism does not serve.
StatusOr<std::string> encode_pass(const ForwardBatch& batch, int64_t chunk_bytes,
                                  const kv::KvFormat& base) {
  Writer w;
  w.put(Message::kPass);
  for (const auto* copies : {&batch.copies.swap_out, &batch.copies.swap_in, &batch.copies.device}) {
    w.put(static_cast<uint32_t>(copies->size()));
    for (const kv::BlockCopy& c : *copies) {
      if (!(c.format == base) || c.heads != 0) {
        return invalid_argument_error("tensor parallelism moves whole base-format blocks only");
      }
      w.put(c.source.value);
      w.put(c.destination.value);
    }
  }
  w.put(static_cast<uint32_t>(batch.chunks.size()));
  for (const SequenceChunk& c : batch.chunks) {
    if ((c.layout && !c.layout->is_default()) || c.observe_attention) {
      return invalid_argument_error("sequence " + std::to_string(c.seq.value) +
                                    ": tensor parallelism serves the default KV layout, without "
                                    "attention observation");
    }
    w.put(c.seq.value);
    w.put(c.start_position);
    w.put(static_cast<uint8_t>(c.logits));
    w.put(static_cast<uint8_t>(c.samples));
    w.put(static_cast<uint8_t>(c.compress_kv));
    w.put(static_cast<uint32_t>(c.tokens.size()));
    w.bytes(c.tokens.data(), c.tokens.size() * sizeof(TokenId));
    w.put(c.restored_tokens);
    w.put(static_cast<uint32_t>(c.computed_rows.size()));
    w.bytes(c.computed_rows.data(), c.computed_rows.size() * sizeof(int64_t));
    w.put(static_cast<uint32_t>(c.tables.size()));
    for (const std::vector<kv::BlockId>& table : c.tables) {
      w.put(static_cast<uint32_t>(table.size()));
      w.bytes(table.data(), table.size() * sizeof(kv::BlockId));
    }
  }
  w.put(static_cast<uint32_t>(batch.loads.size()));
  for (const KvLoad& load : batch.loads) {
    if (load.encoding) {
      return invalid_argument_error("tensor parallelism loads raw chunks only (no store codec)");
    }
    w.put(load.seq.value);
    w.put(load.first_block);
    w.put(static_cast<uint32_t>(load.chunks.size()));
    for (const std::byte* chunk : load.chunks) {
      if (chunk == nullptr) return invalid_argument_error("null load source");
      w.bytes(chunk, static_cast<size_t>(chunk_bytes));
    }
  }
  w.put(static_cast<uint32_t>(batch.saves.size()));
  for (const KvSave& save : batch.saves) {
    w.put(save.seq.value);
    w.put(save.first_block);
    w.put(static_cast<uint32_t>(save.chunks.size()));
  }
  return w.take();
}

// A pass as this rank's executor takes it, with the memory its pointers and spans refer to.
struct RankPass {
  ForwardBatch batch;
  std::vector<std::vector<std::vector<kv::BlockId>>> tables;  // per chunk
  std::vector<at::Tensor> loaded;  // per loaded chunk: this rank's heads, [L, 2, Hkv_r, B, D]
  at::Tensor saved;                // [saved chunks, L, 2, Hkv_r, B, D]: filled by the pass
};

// Chunk layout of the whole model: [L, 2, Hkv, B, D] in the pool's dtype.
std::vector<int64_t> chunk_shape(const model::ModelConfig& model, const kv::KvGeometry& local,
                                 int64_t kv_heads) {
  return {model.num_layers, 2, kv_heads, local.block_size_tokens, model.head_dim};
}

StatusOr<RankPass> decode_pass(std::string_view plan, const TorchExecutor& local,
                               const TensorShard& shard) {
  const model::ModelConfig& model = local.config();
  const kv::KvGeometry& geometry = local.kv_geometry();
  const at::ScalarType dtype = kernels::aten::scalar_type(local.dtype());
  const std::vector<int64_t> whole = chunk_shape(model, geometry, model.num_kv_heads);
  const int64_t chunk_bytes = at::elementSize(dtype) *
                              whole[0] * whole[1] * whole[2] * whole[3] * whole[4];
  Reader r(plan.substr(1));
  RankPass pass;
  ForwardBatch& batch = pass.batch;
  for (auto* copies : {&batch.copies.swap_out, &batch.copies.swap_in, &batch.copies.device}) {
    copies->resize(r.get<uint32_t>());
    for (kv::BlockCopy& c : *copies) {
      c.source.value = r.get<int32_t>();
      c.destination.value = r.get<int32_t>();
      c.format = local.kv_format();
    }
  }
  batch.chunks.resize(r.get<uint32_t>());
  pass.tables.resize(batch.chunks.size());
  for (size_t i = 0; i < batch.chunks.size() && r.good(); ++i) {
    SequenceChunk& c = batch.chunks[i];
    c.seq.value = r.get<uint64_t>();
    c.start_position = r.get<int64_t>();
    c.logits = static_cast<LogitsMode>(r.get<uint8_t>());
    c.samples = r.get<uint8_t>() != 0;
    c.compress_kv = r.get<uint8_t>() != 0;
    c.tokens.resize(r.get<uint32_t>());
    if (const char* p = r.take(c.tokens.size() * sizeof(TokenId))) {
      std::memcpy(c.tokens.data(), p, c.tokens.size() * sizeof(TokenId));
    }
    c.restored_tokens = r.get<int64_t>();
    c.computed_rows.resize(r.get<uint32_t>());
    if (const char* p = r.take(c.computed_rows.size() * sizeof(int64_t))) {
      std::memcpy(c.computed_rows.data(), p, c.computed_rows.size() * sizeof(int64_t));
    }
    pass.tables[i].resize(r.get<uint32_t>());
    for (std::vector<kv::BlockId>& table : pass.tables[i]) {
      table.resize(r.get<uint32_t>());
      if (const char* p = r.take(table.size() * sizeof(kv::BlockId))) {
        std::memcpy(table.data(), p, table.size() * sizeof(kv::BlockId));
      }
    }
    c.tables = pass.tables[i];
  }
  batch.loads.resize(r.get<uint32_t>());
  for (KvLoad& load : batch.loads) {
    load.seq.value = r.get<uint64_t>();
    load.first_block = r.get<int64_t>();
    load.chunks.resize(r.get<uint32_t>());
    for (const std::byte*& chunk : load.chunks) {
      const char* p = r.take(static_cast<size_t>(chunk_bytes));
      if (p == nullptr) break;
      // The rank's heads of the whole chunk.
      at::Tensor mine = at::from_blob(const_cast<char*>(p), whole, dtype)
                            .narrow(2, shard.kv_heads.begin, shard.kv_heads.size())
                            .contiguous();
      chunk = static_cast<const std::byte*>(mine.data_ptr());
      pass.loaded.push_back(std::move(mine));
    }
  }
  batch.saves.resize(r.get<uint32_t>());
  int64_t saved = 0;
  for (KvSave& save : batch.saves) {
    save.seq.value = r.get<uint64_t>();
    save.first_block = r.get<int64_t>();
    save.chunks.resize(r.get<uint32_t>());
    saved += static_cast<int64_t>(save.chunks.size());
  }
  if (!r.ok()) return internal_error("tensor parallelism: a malformed pass plan");
  if (saved > 0) {
    std::vector<int64_t> shape = chunk_shape(model, geometry, shard.kv_heads.size());
    shape.insert(shape.begin(), saved);
    pass.saved = at::empty(shape, dtype);
    int64_t j = 0;
    for (KvSave& save : batch.saves) {
      for (std::byte*& chunk : save.chunks) {
        chunk = static_cast<std::byte*>(pass.saved[j++].data_ptr());
      }
    }
  }
  return pass;
}

// Runs a pass on this rank, then gathers the saved chunks' heads from their owners: on rank 0,
// every saved chunk whole, [saved chunks, L, 2, Hkv, B, D] on the host (undefined without saves).
StatusOr<std::pair<ForwardResult, at::Tensor>> run_pass(TorchExecutor& local,
                                                        const TensorShard& shard,
                                                        std::string_view plan) {
  STRATA_ASSIGN_OR_RETURN(RankPass pass, decode_pass(plan, local, shard));
  STRATA_ASSIGN_OR_RETURN(ForwardResult result, local.forward(pass.batch));
  if (result.saves_written) result.saves_written();
  result.saves_written = nullptr;
  if (!pass.saved.defined()) return std::pair{std::move(result), at::Tensor()};
  // Every rank's heads padded to the most any rank holds, gathered on the collectives' device.
  const at::Device device = local.device().kind == DeviceKind::kCuda
                                ? at::Device(at::kCUDA, static_cast<int8_t>(local.device().index))
                                : at::Device(at::kCPU);
  std::vector<int64_t> shape = pass.saved.sizes().vec();
  const int64_t n = shape[0];
  shape[3] = shard.max_kv_heads;
  at::Tensor padded = at::zeros(shape, pass.saved.options().device(device));
  padded.narrow(3, 0, shard.kv_heads.size()).copy_(pass.saved);
  shape[0] = n * shard.world_size;
  at::Tensor all = at::empty(shape, padded.options());
  STRATA_RETURN_IF_ERROR(shard.group->all_gather(padded, all));
  if (shard.rank != 0) return std::pair{std::move(result), at::Tensor()};
  const int64_t kv_heads = local.config().num_kv_heads;
  shape[0] = n;
  shape[3] = kv_heads;
  at::Tensor whole = at::empty(shape, padded.options());
  for (int64_t h = 0; h < kv_heads; ++h) {
    const int32_t owner = shard.owner_of_kv_head(h);
    whole.select(3, h).copy_(
        all.narrow(0, owner * n, n).select(3, h - shard.kv_heads_of_rank[owner].begin));
  }
  return std::pair{std::move(result), whole.to(at::kCPU)};
}

class TensorParallelExecutor final : public Executor {
 public:
  TensorParallelExecutor(std::unique_ptr<TorchExecutor> local, TensorShard shard,
                         std::function<void(const Status&)> on_failure)
      : local_(std::move(local)), shard_(std::move(shard)), on_failure_(std::move(on_failure)) {
    geometry_ = local_->kv_geometry();
    geometry_.num_kv_heads = static_cast<int32_t>(local_->config().num_kv_heads);
    chunk_bytes_ = geometry_.num_layers *
                   kv::block_bytes(local_->kv_format(), geometry_.num_kv_heads,
                                   geometry_.block_size_tokens, geometry_.head_dim);
  }
  ~TensorParallelExecutor() override {
    if (!failed_.ok()) return;
    std::string stop(1, static_cast<char>(Message::kStop));
    (void)shard_.group->broadcast_bytes(stop, 0);  // the others stop; nothing to do if they can't
  }

  const model::ModelConfig& config() const override { return local_->config(); }
  const ExecutorOptions& options() const override { return local_->options(); }
  Device device() const override { return local_->device(); }
  DType dtype() const override { return local_->dtype(); }
  void init_calling_thread() const override { local_->init_calling_thread(); }
  bool streams_loads() const override { return false; }  // the plan carries the loads' bytes
  const kv::KvGeometry& kv_geometry() const override { return geometry_; }
  kv::KvFormat kv_format() const override { return local_->kv_format(); }
  const kernels::KernelReport& kernel_report() const override { return local_->kernel_report(); }
  const WeightReport& weight_report() const override { return local_->weight_report(); }
  int64_t kv_chunk_bytes() const override { return chunk_bytes_; }
  int64_t kv_chunk_bytes(const kv::KvFormat& format) const override {
    return geometry_.num_layers * kv::block_bytes(format, geometry_.num_kv_heads,
                                                  geometry_.block_size_tokens, geometry_.head_dim);
  }
  Status transcode_kv_chunks(const std::optional<kv::KvFormat>&, const std::optional<kv::KvFormat>&,
                             std::span<const std::byte* const>,
                             std::span<std::byte* const>) const override {
    return unimplemented_error("the store's lossy codecs are not served with tensor parallelism");
  }
  int64_t kv_chunk_bytes(const kv::krul::MergedForm& form) const override {
    const kv::KvGeometry& g = geometry_;
    const int64_t values = g.num_layers * 2 * g.num_kv_heads * g.block_size_tokens * g.head_dim;
    return kernels::aten::krul_merged_chunk_bytes(
        form, g.num_layers, g.num_kv_heads, g.block_size_tokens, g.head_dim, chunk_bytes_ / values);
  }
  Status merge_kv_chunks(const kv::krul::MergedForm&, const std::vector<kv::krul::LayerPair>&,
                         std::span<const std::byte* const>,
                         std::span<std::byte* const>) const override {
    return unimplemented_error("the store's lossy codecs are not served with tensor parallelism");
  }
  Status unmerge_kv_chunks(const kv::krul::MergedForm& form,
                           const std::vector<kv::krul::LayerPair>& pairs,
                           std::span<const std::byte* const> in, std::span<std::byte* const> out,
                           int32_t, int32_t) const override {
    return merge_kv_chunks(form, pairs, in, out);
  }
  Status keep_heavy_hitters(std::span<const float>, std::span<const std::byte* const>,
                            std::span<std::byte* const>) const override {
    return unimplemented_error("the store's lossy codecs are not served with tensor parallelism");
  }
  void drop_preload(SeqId) override {}  // pre-loads are not sent to the ranks
  void end_sequence(SeqId) override {}  // no per-sequence state besides the pool
  std::optional<kv::krul::AttentionStats> take_attention_stats(SeqId) override {
    return std::nullopt;
  }
  LeanKvCounts leankv_counts() const override { return {}; }
  FreeKvCounts freekv_counts() const override { return {}; }
  int64_t leankv_free_pages() const override { return 0; }
  int64_t leankv_step_pages(SeqId) const override { return 0; }
  void register_host_memory(void* data, size_t bytes) const override {
    local_->register_host_memory(data, bytes);
  }
  void unregister_host_memory(void* data) const override { local_->unregister_host_memory(data); }

  StatusOr<ForwardResult> forward(const ForwardBatch& batch) override {
    if (!failed_.ok()) return failed_;
    const double collective_start = shard_.group->collective_seconds();
    STRATA_ASSIGN_OR_RETURN(std::string plan,
                            encode_pass(batch, chunk_bytes_, local_->kv_format()));
    STRATA_RETURN_IF_ERROR(checked(shard_.group->broadcast_bytes(plan, 0)));
    StatusOr<std::pair<ForwardResult, at::Tensor>> ran = run_pass(*local_, shard_, plan);
    if (!ran.ok()) return checked(ran.status());
    auto& [result, saved] = *ran;
    int64_t j = 0;
    for (const KvSave& save : batch.saves) {
      for (std::byte* chunk : save.chunks) {
        std::memcpy(chunk, saved[j++].data_ptr(), static_cast<size_t>(chunk_bytes_));
      }
    }
    result.collective_seconds = shard_.group->collective_seconds() - collective_start;
    return std::move(result);
  }

  void keep_alive() override {
    if (!failed_.ok() || std::chrono::steady_clock::now() - last_message_ < kPingInterval) return;
    std::string ping(1, static_cast<char>(Message::kPing));
    (void)checked(shard_.group->broadcast_bytes(ping, 0));
  }

 private:
  // A collective's failure breaks the group for good: every later pass fails with it.
  Status checked(Status status) {
    last_message_ = std::chrono::steady_clock::now();
    if (status.code() != StatusCode::kUnavailable) return status;
    failed_ = Status(StatusCode::kUnavailable,
                     "tensor-parallel group failed (a rank died or hangs): " + status.message());
    if (on_failure_) on_failure_(failed_);
    return failed_;
  }

  std::unique_ptr<TorchExecutor> local_;
  TensorShard shard_;
  std::function<void(const Status&)> on_failure_;
  kv::KvGeometry geometry_;  // the local pool's, with every KV head (the chunks the store holds)
  int64_t chunk_bytes_ = 0;  // a whole chunk: every layer and KV head
  Status failed_;
  std::chrono::steady_clock::time_point last_message_ = std::chrono::steady_clock::now();
};

StatusOr<std::unique_ptr<TorchExecutor>> load_rank(const model::ModelSource& source,
                                                   const ExecutorOptions& options,
                                                   TensorShard& shard) {
  STRATA_ASSIGN_OR_RETURN(shard, TensorShard::plan(source.config(), options.group->rank(),
                                                   options.group->world_size()));
  shard.group = options.group;
  auto local = std::make_unique<TorchExecutor>(source.config(), options, shard);
  STRATA_RETURN_IF_ERROR(local->load(source));
  return local;
}

}  // namespace

StatusOr<std::unique_ptr<Executor>> create_tensor_parallel(const model::ModelSource& source,
                                                           const ExecutorOptions& options) {
  TensorShard shard;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TorchExecutor> local, load_rank(source, options, shard));
  return std::unique_ptr<Executor>(
      new TensorParallelExecutor(std::move(local), std::move(shard), options.on_group_failure));
}

Status serve_tensor_parallel_rank(const model::ModelSource& source, const ExecutorOptions& options) {
  if (options.group == nullptr || options.group->rank() == 0) {
    return invalid_argument_error("serve_tensor_parallel_rank: not a rank > 0 of a group");
  }
  TensorShard shard;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TorchExecutor> local, load_rank(source, options, shard));
  local->init_calling_thread();
  while (true) {
    std::string plan;
    STRATA_RETURN_IF_ERROR(options.group->broadcast_bytes(plan, 0));
    if (plan.empty()) return internal_error("tensor parallelism: an empty message");
    switch (static_cast<Message>(plan[0])) {
      case Message::kStop:
        return Status();
      case Message::kPing:
        continue;
      case Message::kPass: {
        // Rank 0 runs the same plan and reports what fails there; only a broken group ends this.
        StatusOr<std::pair<ForwardResult, at::Tensor>> ran = run_pass(*local, shard, plan);
        if (!ran.ok() && ran.status().code() == StatusCode::kUnavailable) return ran.status();
        continue;
      }
    }
    return internal_error("tensor parallelism: an unknown message");
  }
}

}  // namespace strata::executor
