// Tensor parallelism: rank 0's executor, the plan on the wire, and the other ranks' loop
// (tensor_parallel.h).

#include "tensor_parallel.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/dist/communicator.h"
#include "strata/model/model_source.h"
#include "tensor_parallel_store.h"
#include "torch_executor.h"

namespace strata::executor {
namespace {

enum class Message : uint8_t { kPass = 1, kPing = 2, kStop = 3, kHeld = 4, kStats = 5 };

// How long rank 0 stays silent before it pings the others: well inside any collective timeout.
constexpr auto kPingInterval = std::chrono::seconds(1);
// How often rank 0 asks the other ranks for their stores' numbers (StoreFollowers::rank_stats).
constexpr auto kStatsInterval = std::chrono::seconds(5);

// The batch's plan, after `events` (the store events since the last message); INVALID_ARGUMENT
// for what tensor parallelism does not serve.
StatusOr<std::string> encode_pass(const ForwardBatch& batch, const kv::KvFormat& base,
                                  std::string_view events, FollowerFeed& feed) {
  Writer w;
  w.put(Message::kPass);
  w.string(events);
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
    w.span(std::span<const TokenId>(c.tokens));
    w.put(c.restored_tokens);
    w.span(std::span<const int64_t>(c.computed_rows));
    w.put(static_cast<uint32_t>(c.tables.size()));
    for (const std::vector<kv::BlockId>& table : c.tables) {
      w.span(std::span<const kv::BlockId>(table));
    }
  }
  w.put(static_cast<uint32_t>(batch.loads.size()));
  for (const KvLoad& load : batch.loads) {
    const std::vector<store::StoredRun> runs = feed.take_runs(load.seq);
    int64_t named = 0;
    for (const store::StoredRun& run : runs) named += run.count;
    if (load.encoding || load.arrivals || named != std::ssize(load.chunks)) {
      return invalid_argument_error("sequence " + std::to_string(load.seq.value) +
                                    ": tensor parallelism loads raw stored chunks, named for every "
                                    "rank's store (no codec, pre-load or streamed read)");
    }
    w.put(load.seq.value);
    w.put(load.first_block);
    w.put(static_cast<uint32_t>(runs.size()));
    for (const store::StoredRun& run : runs) write_run(w, run);
  }
  w.put(static_cast<uint32_t>(batch.saves.size()));
  for (const KvSave& save : batch.saves) {
    w.put(save.seq.value);
    w.put(save.first_block);
    w.put(static_cast<uint32_t>(save.chunks.size()));
  }
  return w.take();
}

// A pass as this rank's executor takes it, with the memory its spans refer to; its loads' and
// saves' chunks are this rank's to fill.
struct RankPass {
  ForwardBatch batch;
  std::vector<std::vector<std::vector<kv::BlockId>>> tables;  // per chunk
  std::vector<std::vector<store::StoredRun>> runs;            // per load
};

// The pass after a message's kind and events.
StatusOr<RankPass> decode_pass(Reader& r, const kv::KvFormat& format) {
  RankPass pass;
  ForwardBatch& batch = pass.batch;
  for (auto* copies : {&batch.copies.swap_out, &batch.copies.swap_in, &batch.copies.device}) {
    copies->resize(std::min<size_t>(r.get<uint32_t>(), 1 << 24));
    for (kv::BlockCopy& c : *copies) {
      c.source.value = r.get<int32_t>();
      c.destination.value = r.get<int32_t>();
      c.format = format;
    }
  }
  batch.chunks.resize(std::min<size_t>(r.get<uint32_t>(), 1 << 16));
  pass.tables.resize(batch.chunks.size());
  for (size_t i = 0; i < batch.chunks.size() && r.good(); ++i) {
    SequenceChunk& c = batch.chunks[i];
    c.seq.value = r.get<uint64_t>();
    c.start_position = r.get<int64_t>();
    c.logits = static_cast<LogitsMode>(r.get<uint8_t>());
    c.samples = r.get<uint8_t>() != 0;
    c.compress_kv = r.get<uint8_t>() != 0;
    c.tokens = r.vector<TokenId>();
    c.restored_tokens = r.get<int64_t>();
    c.computed_rows = r.vector<int64_t>();
    pass.tables[i].resize(std::min<size_t>(r.get<uint32_t>(), 1 << 16));
    for (std::vector<kv::BlockId>& table : pass.tables[i]) table = r.vector<kv::BlockId>();
    c.tables = pass.tables[i];
  }
  batch.loads.resize(std::min<size_t>(r.get<uint32_t>(), 1 << 16));
  pass.runs.resize(batch.loads.size());
  for (size_t i = 0; i < batch.loads.size() && r.good(); ++i) {
    batch.loads[i].seq.value = r.get<uint64_t>();
    batch.loads[i].first_block = r.get<int64_t>();
    pass.runs[i].resize(std::min<size_t>(r.get<uint32_t>(), 1 << 16));
    for (store::StoredRun& run : pass.runs[i]) run = read_run(r);
  }
  batch.saves.resize(std::min<size_t>(r.get<uint32_t>(), 1 << 16));
  for (KvSave& save : batch.saves) {
    save.seq.value = r.get<uint64_t>();
    save.first_block = r.get<int64_t>();
    save.chunks.resize(std::min<size_t>(r.get<uint32_t>(), 1 << 20));
  }
  if (!r.ok()) return internal_error("tensor parallelism: a malformed pass plan");
  return pass;
}

// Where this rank's collectives take tensors (NCCL: its GPU).
at::Device collective_device(const TorchExecutor& local) {
  return local.device().kind == DeviceKind::kCuda
             ? at::Device(at::kCUDA, static_cast<int8_t>(local.device().index))
             : at::Device(at::kCPU);
}

// Every rank's answer to a held_by_all query, `own` being this rank's: the least of them.
StatusOr<int64_t> least_held(const TorchExecutor& local, const TensorShard& shard, int64_t own) {
  const at::Device device = collective_device(local);
  at::Tensor mine = at::full({1}, own, at::TensorOptions(at::kLong).device(device));
  at::Tensor all = at::empty({shard.world_size}, mine.options());
  STRATA_RETURN_IF_ERROR(shard.group->all_gather(mine, all));
  return all.min().cpu().item<int64_t>();
}

// Every rank's store numbers (stats_row; `own` is this rank's), [world_size * kStatsRow] int64
// on the host.
StatusOr<at::Tensor> gather_stats(const TorchExecutor& local, const TensorShard& shard,
                                  const std::vector<int64_t>& own) {
  const at::Tensor mine = at::tensor(own, at::kLong).to(collective_device(local));
  at::Tensor all = at::empty({shard.world_size * kStatsRow}, mine.options());
  STRATA_RETURN_IF_ERROR(shard.group->all_gather(mine, all));
  return all.cpu();
}

// Runs a pass on this rank. Its loads read and saves write the chunks of `own` (rank 0's batch:
// its store's leases and tickets) or of this rank's `store`. A load some rank could not pin
// fails on every rank: the result lists its sequence in failed_loads.
StatusOr<ForwardResult> run_pass(TorchExecutor& local, const TensorShard& shard, Reader& plan,
                                 const ForwardBatch* own, RankStore* store) {
  STRATA_ASSIGN_OR_RETURN(RankPass pass, decode_pass(plan, local.kv_format()));
  ForwardBatch& batch = pass.batch;
  if (own == nullptr && store == nullptr && (!batch.loads.empty() || !batch.saves.empty())) {
    return internal_error("tensor parallelism: loads or saves for a rank without a KV store");
  }
  std::vector<float> failed(batch.loads.size(), 0.0f);
  for (size_t i = 0; i < batch.loads.size(); ++i) {
    if (own != nullptr) {
      batch.loads[i].chunks = own->loads[i].chunks;
    } else if (!store->load(pass.runs[i], &batch.loads[i].chunks)) {
      failed[i] = 1;
    }
  }
  for (size_t i = 0; i < batch.saves.size(); ++i) {
    KvSave& save = batch.saves[i];
    if (own != nullptr) {
      save.chunks = own->saves[i].chunks;
    } else {
      store->save(save.seq, save.first_block, &save.chunks);
    }
  }
  StatusOr<ForwardResult> ran = local.forward(batch);
  if (ran.ok() && ran->saves_written) {
    ran->saves_written();
    ran->saves_written = nullptr;
  }
  if (store != nullptr) store->after_pass();
  if (!ran.ok()) return ran.status();
  if (batch.loads.empty()) return ran;
  // Every rank's loads agreed: one that failed anywhere failed everywhere.
  at::Tensor flags = at::tensor(failed).to(collective_device(local));
  STRATA_RETURN_IF_ERROR(shard.group->all_reduce_sum(flags));
  flags = flags.to(at::kCPU);
  for (size_t i = 0; i < batch.loads.size(); ++i) {
    const SeqId seq = batch.loads[i].seq;
    if (flags[static_cast<int64_t>(i)].item<float>() > 0 &&
        std::ranges::find(ran->failed_loads, seq) == ran->failed_loads.end()) {
      ran->failed_loads.push_back(seq);
    }
  }
  return ran;
}

// Past a message's kind and events (rank 0 applied its events already).
void skip_kind_and_events(Reader& r) {
  r.get<Message>();
  r.string();
}

// This rank's store (rank > 0): the deployment's, over its heads (as rank 0's coordinator opens
// its own: restore::RestoreCoordinator::open, FollowerFeed::rank_options).
StatusOr<std::unique_ptr<RankStore>> open_rank_store(const store::StoreConfig& config,
                                                     const TorchExecutor& local,
                                                     const TensorShard& shard,
                                                     uint64_t model_fingerprint) {
  store::StoreOptions options = store::StoreOptions::from_config(config);
  options.chunk_bytes = local.kv_chunk_bytes();
  options.block_size_tokens = local.kv_geometry().block_size_tokens;
  options.chunk_layers = local.config().num_layers;
  options.layout_tag = store::layout_tag(model_fingerprint, local.kv_format(),
                                         options.block_size_tokens, options.chunk_bytes);
  store::make_rank_options(&options, shard.rank, shard.world_size, shard.kv_heads.size(),
                           shard.max_kv_heads);
  options.register_host_memory = [&local](void* data, size_t bytes) {
    local.register_host_memory(data, bytes);
  };
  options.unregister_host_memory = [&local](void* data) { local.unregister_host_memory(data); };
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<store::KvStore> opened, store::KvStore::open(options));
  return std::make_unique<RankStore>(std::move(opened));
}

class TensorParallelExecutor final : public Executor {
 public:
  TensorParallelExecutor(std::unique_ptr<TorchExecutor> local, TensorShard shard,
                         std::function<void(const Status&)> on_failure)
      : local_(std::move(local)),
        shard_(std::move(shard)),
        feed_(shard_, [this](std::string query, int64_t own) { return held(query, own); }),
        on_failure_(std::move(on_failure)) {}
  ~TensorParallelExecutor() override {
    if (!failed_.ok()) return;
    std::string stop = message(Message::kStop);
    (void)shard_.group->broadcast_bytes(stop, 0);  // the others stop; nothing to do if they can't
  }

  const model::ModelConfig& config() const override { return local_->config(); }
  const ExecutorOptions& options() const override { return local_->options(); }
  Device device() const override { return local_->device(); }
  DType dtype() const override { return local_->dtype(); }
  void init_calling_thread() const override { local_->init_calling_thread(); }
  bool streams_loads() const override { return false; }  // every rank pins its loads first
  // This rank's pool: its KV heads (so are its store's chunks).
  const kv::KvGeometry& kv_geometry() const override { return local_->kv_geometry(); }
  kv::KvFormat kv_format() const override { return local_->kv_format(); }
  const kernels::KernelReport& kernel_report() const override { return local_->kernel_report(); }
  const WeightReport& weight_report() const override { return local_->weight_report(); }
  int64_t kv_chunk_bytes() const override { return local_->kv_chunk_bytes(); }
  int64_t kv_chunk_bytes(const kv::KvFormat& format) const override {
    return local_->kv_chunk_bytes(format);
  }
  Status transcode_kv_chunks(const std::optional<kv::KvFormat>&, const std::optional<kv::KvFormat>&,
                             std::span<const std::byte* const>,
                             std::span<std::byte* const>) const override {
    return unimplemented_error("the store's lossy codecs are not served with tensor parallelism");
  }
  int64_t kv_chunk_bytes(const kv::krul::MergedForm& form) const override {
    return local_->kv_chunk_bytes(form);
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
  store::StoreFollowers* store_followers() override { return &feed_; }

  StatusOr<ForwardResult> forward(const ForwardBatch& batch) override {
    if (!failed_.ok()) return failed_;
    const double collective_start = shard_.group->collective_seconds();
    StatusOr<std::string> plan =
        encode_pass(batch, local_->kv_format(), feed_.take_events(), feed_);
    feed_.clear_runs();
    if (!plan.ok()) return plan.status();
    STRATA_RETURN_IF_ERROR(checked(shard_.group->broadcast_bytes(*plan, 0)));
    Reader r(*plan);
    skip_kind_and_events(r);
    StatusOr<ForwardResult> ran = run_pass(*local_, shard_, r, &batch, nullptr);
    if (!ran.ok()) return checked(ran.status());
    ran->collective_seconds = shard_.group->collective_seconds() - collective_start;
    gather_rank_stats();
    return ran;
  }

  void keep_alive() override {
    gather_rank_stats();
    if (!failed_.ok() || std::chrono::steady_clock::now() - last_message_ < kPingInterval) return;
    std::string ping = message(Message::kPing);
    (void)checked(shard_.group->broadcast_bytes(ping, 0));
  }

 private:
  // FollowerFeed::held_by_all's question to the other ranks (kHeld: the events, the query).
  int64_t held(const std::string& query, int64_t own) {
    if (!failed_.ok()) return 0;
    std::string ask = message(Message::kHeld) + query;
    if (!checked(shard_.group->broadcast_bytes(ask, 0)).ok()) return 0;
    StatusOr<int64_t> least = least_held(*local_, shard_, own);
    if (!least.ok()) {
      (void)checked(least.status());
      return 0;
    }
    return *least;
  }

  // Every kStatsInterval: the other ranks' store numbers, for rank_stats() (kStats: the events,
  // then an all-gather of each rank's stats_row; rank 0 sends zeros, its store reports itself).
  void gather_rank_stats() {
    const auto now = std::chrono::steady_clock::now();
    if (!failed_.ok() || now - last_stats_ < kStatsInterval) return;
    last_stats_ = now;
    std::string ask = message(Message::kStats);
    if (!checked(shard_.group->broadcast_bytes(ask, 0)).ok()) return;
    StatusOr<at::Tensor> rows = gather_stats(*local_, shard_, std::vector<int64_t>(kStatsRow, 0));
    if (!rows.ok()) {
      (void)checked(rows.status());
      return;
    }
    feed_.set_rank_rows(
        std::span<const int64_t>(rows->data_ptr<int64_t>(), rows->numel()).subspan(kStatsRow));
  }

  // A message without a pass: its kind and the store events since the last one.
  std::string message(Message kind) {
    Writer w;
    w.put(kind);
    w.string(feed_.take_events());
    return w.take();
  }

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
  FollowerFeed feed_;
  std::function<void(const Status&)> on_failure_;
  Status failed_;
  std::chrono::steady_clock::time_point last_message_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_stats_ = std::chrono::steady_clock::now();
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

Status serve_tensor_parallel_rank(const model::ModelSource& source, const ExecutorOptions& options,
                                  const store::StoreConfig& store) {
  if (options.group == nullptr || options.group->rank() == 0) {
    return invalid_argument_error("serve_tensor_parallel_rank: not a rank > 0 of a group");
  }
  TensorShard shard;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TorchExecutor> local, load_rank(source, options, shard));
  local->init_calling_thread();
  std::unique_ptr<RankStore> rank_store;
  if (store.enabled()) {
    STRATA_ASSIGN_OR_RETURN(rank_store,
                            open_rank_store(store, *local, shard, source.content_fingerprint()));
  }
  while (true) {
    std::string message;
    STRATA_RETURN_IF_ERROR(options.group->broadcast_bytes(message, 0));
    if (message.empty()) return internal_error("tensor parallelism: an empty message");
    const auto kind = static_cast<Message>(message[0]);
    if (kind != Message::kPing && kind != Message::kPass && kind != Message::kStop &&
        kind != Message::kHeld && kind != Message::kStats) {
      return internal_error("tensor parallelism: an unknown message");
    }
    Reader r(message);
    r.get<Message>();
    const std::string events = r.string();
    // (The last turn's saves end with the stop: the store then writes them to its lower tiers.)
    if (rank_store != nullptr) STRATA_RETURN_IF_ERROR(rank_store->apply(events));
    if (kind == Message::kStop) return Status();
    if (kind == Message::kPing) continue;
    if (kind == Message::kStats) {
      const std::vector<int64_t> own = rank_store != nullptr ? stats_row(rank_store->stats())
                                                             : std::vector<int64_t>(kStatsRow, 0);
      STRATA_RETURN_IF_ERROR(gather_stats(*local, shard, own).status());
      continue;
    }
    if (kind == Message::kHeld) {
      const int64_t own = rank_store != nullptr ? rank_store->held(r) : 0;
      STRATA_RETURN_IF_ERROR(least_held(*local, shard, own).status());
      continue;
    }
    // Rank 0 runs the same plan and reports what fails there; only a broken group ends this.
    StatusOr<ForwardResult> ran = run_pass(*local, shard, r, nullptr, rank_store.get());
    if (!ran.ok() && ran.status().code() == StatusCode::kUnavailable) return ran.status();
  }
}

}  // namespace strata::executor
