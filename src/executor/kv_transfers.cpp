// The KV store's transfers around a forward pass (CachedAttention): loads of stored chunks into
// the pool layer by layer (raw, or encoded by the store's lossy codec and decoded on the device),
// the read buffer's pre-loads, layer-wise saves out of the pool, and the re-encoding of chunks the
// store asks for (AdaptCache; Krul's merged form of layer pairs).

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "layers.h"
#include "strata/common/clock.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"
#include "torch_executor.h"

namespace strata::executor {

using kernels::KernelOp;

void TorchExecutor::rotate_keys(at::Tensor& blocks, const at::Tensor& first_positions,
                                bool inverse) const {
  const int64_t n = blocks.size(0), heads = blocks.size(2), block = blocks.size(3);
  const int64_t dim = blocks.size(4);
  at::Tensor positions =
      (first_positions.unsqueeze(1) + at::arange(block, first_positions.options())).reshape({-1});
  if (inverse) positions = -positions;
  // In float32 whatever the pool's dtype, so a round trip loses no more than one rounding.
  const RotaryTables tables = make_rotary_tables(positions, inv_freq_, at::kFloat);
  at::Tensor keys = blocks.select(1, 0).permute({0, 2, 1, 3}).reshape({n * block, heads, dim});
  keys = kernels::apply_rotary(keys.to(at::kFloat).contiguous(), tables.cos, tables.sin,
                               kernel_report_.backend(KernelOp::kRotary));
  blocks.select(1, 0).copy_(keys.view({n, block, heads, dim}).permute({0, 2, 1, 3}));
}

TorchExecutor::StagedLoads TorchExecutor::stage_loads(const ForwardBatch& batch) {
  StagedLoads staged;
  const int64_t block = kv_geometry_.block_size_tokens;
  const int64_t num_layers = config_.num_layers;
  // Each loaded block, in batch order first.
  struct Block {
    int32_t load = 0;
    int64_t j = 0;  // in its load
    int32_t group = -1;
    std::pair<at::Tensor, int64_t> preloaded;
    int64_t first_layer = 0;  // the first layer that loads it
    std::span<const std::vector<kv::BlockId>> tables;
    int64_t token_block = 0;
  };
  std::vector<Block> blocks;
  for (size_t i = 0; i < batch.loads.size(); ++i) {
    const KvLoad& load = batch.loads[i];
    int32_t group = -1;
    if (load.encoding) {
      auto it = std::find_if(staged.encoded.begin(), staged.encoded.end(),
                             [&](const StagedLoads::Encoded& e) { return e.format == *load.encoding; });
      if (it == staged.encoded.end()) {
        StagedLoads::Encoded group;
        group.format = *load.encoding;
        group.block_bytes =
            kv::block_bytes(group.format, config_.num_kv_heads, block, config_.head_dim);
        it = staged.encoded.insert(it, std::move(group));
      }
      group = static_cast<int32_t>(it - staged.encoded.begin());
    }
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == load.seq; });
    // The read buffer serves the load if it holds the same chunks, from some row on.
    at::Tensor buffer;
    int64_t row = 0;
    if (auto it = read_buffers_.find(load.seq); it != read_buffers_.end() && !load.arrivals) {
      const std::vector<const std::byte*>& held = it->second.chunks;
      auto first = std::find(held.begin(), held.end(), load.chunks.front());
      if (first != held.end() && held.end() - first >= std::ssize(load.chunks) &&
          std::equal(load.chunks.begin(), load.chunks.end(), first)) {
        buffer = it->second.layers;
        row = first - held.begin();
      }
    }
    for (size_t j = 0; j < load.chunks.size(); ++j) {
      Block& b = blocks.emplace_back();
      b.load = static_cast<int32_t>(i);
      b.j = static_cast<int64_t>(j);
      b.group = group;
      b.preloaded = {buffer, row + static_cast<int64_t>(j)};
      b.tables = chunk->tables;
      b.token_block = load.first_block + static_cast<int64_t>(j);
      // A restoring chunk's layers that compute the block do not load it (encoded blocks are
      // decoded at every layer: their groups index the first blocks of every layer).
      const int64_t history_position = b.token_block * block - chunk->start_position;
      if (group < 0 && chunk->restored_tokens > 0 && history_position >= 0) {
        b.first_layer = std::ranges::count_if(
            chunk->computed_rows, [&](int64_t computed) { return computed > history_position; });
      }
    }
  }
  std::ranges::stable_sort(blocks, {}, &Block::first_layer);
  staged.failed.assign(batch.loads.size(), 0);
  std::vector<int64_t> first_positions;
  std::vector<std::vector<int64_t>> destinations(num_layers);
  for (const Block& b : blocks) {
    const KvLoad& load = batch.loads[b.load];
    if (b.group >= 0) staged.encoded[b.group].blocks.push_back(std::ssize(staged.sources));
    staged.group.push_back(b.group);
    staged.sources.push_back(load.chunks[b.j]);
    staged.arrivals.emplace_back(load.arrivals.get(), b.j);
    staged.load_of.push_back(b.load);
    staged.preloaded.push_back(b.preloaded);
    first_positions.push_back(b.token_block * block);
    for (int64_t l = 0; l < num_layers; ++l) {
      destinations[l].push_back(pool_.layout().base_index(b.tables[l][b.token_block]));
    }
  }
  staged.layer_blocks.assign(static_cast<size_t>(num_layers), 0);
  for (int64_t l = 0; l < num_layers; ++l) {
    staged.layer_blocks[l] =
        std::ranges::count_if(blocks, [&](const Block& b) { return b.first_layer <= l; });
  }
  // A pre-load is for the sequence's next pass only.
  for (const SequenceChunk& c : batch.chunks) read_buffers_.erase(c.seq);
  if (staged.sources.empty()) return staged;
  const int64_t n = static_cast<int64_t>(staged.sources.size());
  std::vector<int64_t> flat;
  for (const auto& d : destinations) flat.insert(flat.end(), d.begin(), d.end());
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  staged.destinations = at::tensor(flat, long_opts).view({num_layers, n}).to(device_);
  staged.first_positions = at::tensor(first_positions, long_opts).to(device_);
  for (StagedLoads::Encoded& e : staged.encoded) {
    e.index = at::tensor(e.blocks, long_opts).to(device_);
    if (device_.is_cuda()) {
      e.device_staging = at::empty({num_layers, std::ssize(e.blocks), e.block_bytes},
                                   at::TensorOptions().dtype(at::kByte).device(device_));
    }
  }
  if (device_.is_cuda()) {
    // Every layer's host-to-device copies go out now on a side stream; layer l's attention waits
    // only for layer l's event, so loading later layers overlaps computing earlier ones. Encoded
    // chunks cross as they are stored (fewer bytes) and are decoded on the device.
    staged.device_staging =
        at::empty({num_layers, n, 2, config_.num_kv_heads, block, config_.head_dim},
                  at::TensorOptions().dtype(dtype_).device(device_));
    // Layers held by a read buffer are device-to-device copies, queued behind that buffer's
    // pre-load on the same stream.
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    const c10::cuda::CUDAStream read = read_stream();
    at::cuda::CUDAEvent staging_ready;
    staging_ready.record(compute);
    staging_ready.block(read);
    staged.copies_start.emplace(cudaEventDefault);
    staged.copies_end.emplace(cudaEventDefault);
    staged.copies_start->record(read);
    auto* base = static_cast<std::byte*>(staged.device_staging.data_ptr());
    staged.layer_ready.resize(static_cast<size_t>(num_layers));
    for (int64_t l = 0; l < num_layers; ++l) {
      for (int64_t j = 0; j < staged.layer_blocks[l]; ++j) {
        if (staged.group[j] >= 0) continue;
        // cudaMemcpyDefault: host chunk or read buffer, the runtime tells them apart.
        const cudaError_t rc =
            cudaMemcpyAsync(base + (l * n + j) * block_bytes_, load_source(staged, j, l),
                            static_cast<size_t>(block_bytes_), cudaMemcpyDefault, read.stream());
        TORCH_CHECK(rc == cudaSuccess, "KV load copy failed: ", cudaGetErrorString(rc));
      }
      for (StagedLoads::Encoded& e : staged.encoded) {
        const int64_t m = std::ssize(e.blocks);
        auto* to = static_cast<std::byte*>(e.device_staging.data_ptr());
        for (int64_t i = 0; i < m; ++i) {
          const cudaError_t rc = cudaMemcpyAsync(
              to + (l * m + i) * e.block_bytes, staged.sources[e.blocks[i]] + l * e.block_bytes,
              static_cast<size_t>(e.block_bytes), cudaMemcpyHostToDevice, read.stream());
          TORCH_CHECK(rc == cudaSuccess, "KV load copy failed: ", cudaGetErrorString(rc));
        }
      }
      staged.layer_ready[l].record(read);
    }
    staged.copies_end->record(read);
  }
  return staged;
}

const std::byte* TorchExecutor::load_source(const StagedLoads& loads, int64_t j,
                                            int64_t layer) const {
  const auto& [buffer, row] = loads.preloaded[j];
  if (buffer.defined() && layer < buffer.size(0)) {
    return static_cast<const std::byte*>(buffer.data_ptr()) +
           (layer * buffer.size(1) + row) * block_bytes_;
  }
  return loads.sources[j] + layer * block_bytes_;
}

c10::cuda::CUDAStream TorchExecutor::read_stream() {
  if (!read_stream_) read_stream_ = c10::cuda::getStreamFromPool(false, device_.index());
  return *read_stream_;
}

void TorchExecutor::preload(const ForwardBatch& batch) {
  for (const KvPreload& p : batch.preloads) {
    const auto n = std::ssize(p.chunks);
    ReadBuffer buffer{p.chunks, at::empty({p.num_layers, n, 2, config_.num_kv_heads,
                                           kv_geometry_.block_size_tokens, config_.head_dim},
                                          at::TensorOptions().dtype(dtype_).device(device_))};
    auto* base = static_cast<std::byte*>(buffer.layers.data_ptr());
    if (!device_.is_cuda()) {
      for (int64_t l = 0; l < p.num_layers; ++l) {
        for (int64_t j = 0; j < n; ++j) {
          std::memcpy(base + (l * n + j) * block_bytes_, p.chunks[j] + l * block_bytes_,
                      static_cast<size_t>(block_bytes_));
        }
      }
    } else {
      const c10::cuda::CUDAStream read = read_stream();
      at::cuda::CUDAEvent buffer_ready;  // its memory may have been in use on the compute stream
      buffer_ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
      buffer_ready.block(read);
      for (int64_t l = 0; l < p.num_layers; ++l) {
        for (int64_t j = 0; j < n; ++j) {
          const cudaError_t rc = cudaMemcpyAsync(
              base + (l * n + j) * block_bytes_, p.chunks[j] + l * block_bytes_,
              static_cast<size_t>(block_bytes_), cudaMemcpyHostToDevice, read.stream());
          TORCH_CHECK(rc == cudaSuccess, "KV pre-load copy failed: ", cudaGetErrorString(rc));
        }
      }
      // Dropped before use, its memory must not be reused while the copies run.
      c10::cuda::CUDACachingAllocator::recordStream(buffer.layers.storage().data_ptr(), read);
    }
    read_buffers_[p.seq] = std::move(buffer);
  }
}

void TorchExecutor::insert_loaded_layer(StagedLoads& loads, int64_t layer) {
  const int64_t n = static_cast<int64_t>(loads.sources.size());
  const int64_t count = loads.layer_blocks[layer];
  at::Tensor blocks;
  if (device_.is_cuda()) {
    loads.layer_ready[layer].block(c10::cuda::getCurrentCUDAStream(device_.index()));
    blocks = loads.device_staging[layer].narrow(0, 0, count).clone();
  } else {
    if (!loads.loader) {  // `loads` is where it stays for the pass now
      std::array<std::byte*, 2> buffers{};
      for (size_t b = 0; b < 2; ++b) {
        loads.cpu_staging[b] = at::empty(
            {n, 2, config_.num_kv_heads, kv_geometry_.block_size_tokens, config_.head_dim},
            at::TensorOptions().dtype(dtype_));
        buffers[b] = static_cast<std::byte*>(loads.cpu_staging[b].data_ptr());
      }
      loads.loader = std::make_unique<LayerLoader>(
          config_.num_layers, buffers, [this, &loads](int64_t l, std::byte* out) {
            double copying = 0;
            for (int64_t j = 0; j < loads.layer_blocks[l]; ++j) {
              if (loads.group[j] >= 0) continue;  // encoded: decoded below
              const std::byte* source = nullptr;
              if (loads.sources[j] == nullptr) {  // streamed: read beside the pass
                const auto& [arrivals, index] = loads.arrivals[j];
                const std::byte* chunk = arrivals->wait(index, l);
                if (chunk == nullptr) {
                  loads.failed[loads.load_of[j]] = 1;  // its sequence is recomputed
                  continue;
                }
                source = chunk + l * block_bytes_;
              } else {
                source = load_source(loads, j, l);
              }
              const auto start = std::chrono::steady_clock::now();
              std::memcpy(out + j * block_bytes_, source, static_cast<size_t>(block_bytes_));
              copying += seconds_since(start);
            }
            loads.copy_seconds += copying;
          });
    }
    const auto waiting = std::chrono::steady_clock::now();
    loads.loader->wait(layer);
    loads.wait_seconds += seconds_since(waiting);
    blocks = loads.cpu_staging[layer % 2].narrow(0, 0, count);
  }
  const auto start = std::chrono::steady_clock::now();
  for (const StagedLoads::Encoded& e : loads.encoded) {
    at::Tensor bytes;
    if (device_.is_cuda()) {
      bytes = e.device_staging[layer];
    } else {
      const int64_t m = std::ssize(e.blocks);
      bytes = at::empty({m, e.block_bytes}, at::kByte);
      auto* to = static_cast<std::byte*>(bytes.data_ptr());
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(to + i * e.block_bytes, loads.sources[e.blocks[i]] + layer * e.block_bytes,
                    static_cast<size_t>(e.block_bytes));
      }
    }
    blocks.index_copy_(0, e.index,
                       kernels::unpack_kv_blocks(bytes, e.format, config_.num_kv_heads,
                                                 kv_geometry_.block_size_tokens, config_.head_dim,
                                                 dtype_,
                                                 kernel_report_.backend(KernelOp::kUnpackKvBlocks)));
  }
  if (count > 0) {
    rotate_keys(blocks, loads.first_positions.narrow(0, 0, count), /*inverse=*/false);
    pool_.base_view().index_copy_(0, loads.destinations[layer].narrow(0, 0, count), blocks);
  }
  loads.insert_seconds += seconds_since(start);
  if (loads.loader) loads.loader->release(layer);
}

TorchExecutor::StagedSaves TorchExecutor::stage_saves(const ForwardBatch& batch) {
  StagedSaves staged;
  const int64_t block = kv_geometry_.block_size_tokens;
  const int64_t num_layers = config_.num_layers;
  std::vector<int64_t> first_positions;
  std::vector<std::vector<int64_t>> sources(num_layers);
  for (const KvSave& save : batch.saves) {
    auto chunk = std::find_if(batch.chunks.begin(), batch.chunks.end(),
                              [&](const SequenceChunk& c) { return c.seq == save.seq; });
    for (size_t j = 0; j < save.chunks.size(); ++j) {
      const int64_t token_block = save.first_block + static_cast<int64_t>(j);
      staged.destinations.push_back(save.chunks[j]);
      first_positions.push_back(token_block * block);
      for (int64_t l = 0; l < num_layers; ++l) {
        sources[l].push_back(pool_.layout().base_index(chunk->tables[l][token_block]));
      }
    }
  }
  if (staged.destinations.empty()) return staged;
  const int64_t n = static_cast<int64_t>(staged.destinations.size());
  std::vector<int64_t> flat;
  for (const auto& s : sources) flat.insert(flat.end(), s.begin(), s.end());
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  staged.sources = at::tensor(flat, long_opts).view({num_layers, n}).to(device_);
  staged.first_positions = at::tensor(first_positions, long_opts).to(device_);
  if (device_.is_cuda()) {
    staged.write_buffer =
        at::empty({num_layers, n, 2, config_.num_kv_heads, block, config_.head_dim},
                  at::TensorOptions().dtype(dtype_).device(device_));
    staged.write = c10::cuda::getStreamFromPool(false, device_.index());
  }
  return staged;
}

void TorchExecutor::save_layer(StagedSaves& saves, int64_t layer) {
  const int64_t n = static_cast<int64_t>(saves.destinations.size());
  // [n, 2, Hkv, B, D]
  at::Tensor blocks = pool_.base_view().index_select(0, saves.sources[layer]);
  rotate_keys(blocks, saves.first_positions, /*inverse=*/true);
  if (!device_.is_cuda()) {
    const auto* base = static_cast<const std::byte*>(blocks.data_ptr());
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(saves.destinations[j] + layer * block_bytes_, base + j * block_bytes_,
                  static_cast<size_t>(block_bytes_));
    }
    return;
  }
  // The gather and un-rotation run on the compute stream into the write buffer; the host copies
  // wait for them on the write stream, overlapping the layers that follow.
  saves.write_buffer[layer].copy_(blocks);
  at::cuda::CUDAEvent gathered;
  gathered.record(c10::cuda::getCurrentCUDAStream(device_.index()));
  gathered.block(*saves.write);
  const auto* base = static_cast<const std::byte*>(saves.write_buffer[layer].data_ptr());
  for (int64_t j = 0; j < n; ++j) {
    const cudaError_t rc = cudaMemcpyAsync(
        saves.destinations[j] + layer * block_bytes_, base + j * block_bytes_,
        static_cast<size_t>(block_bytes_), cudaMemcpyDeviceToHost, saves.write->stream());
    TORCH_CHECK(rc == cudaSuccess, "KV save copy failed: ", cudaGetErrorString(rc));
  }
}

int64_t TorchExecutor::kv_chunk_bytes(const kv::KvFormat& format) const {
  return kv_geometry_.num_layers * kv::block_bytes(format, config_.num_kv_heads,
                                                   kv_geometry_.block_size_tokens, config_.head_dim);
}

Status TorchExecutor::transcode_kv_chunks(const std::optional<kv::KvFormat>& from,
                                          const std::optional<kv::KvFormat>& to,
                                          std::span<const std::byte* const> in,
                                          std::span<std::byte* const> out) const {
  const int64_t n = std::ssize(in), layers = kv_geometry_.num_layers;
  const int64_t heads = config_.num_kv_heads, block = kv_geometry_.block_size_tokens;
  const int64_t dim = config_.head_dim;
  const int64_t from_bytes = from ? kv::block_bytes(*from, heads, block, dim) : block_bytes_;
  const int64_t to_bytes = to ? kv::block_bytes(*to, heads, block, dim) : block_bytes_;
  // On CUDA the codec runs on the device (Strata's pack / unpack kernels where the self-check
  // passed them) on a stream of its own, so the caller (a store I/O thread) neither waits for the
  // forward passes nor delays them, a slice of chunks at a time, which bounds the device memory
  // this takes outside the KV pool; on the CPU libtorch runs here.
  constexpr int64_t kSliceChunks = 16;
  const bool cuda = device_.is_cuda();
  std::optional<c10::cuda::CUDAStreamGuard> stream;
  if (cuda) stream.emplace(c10::cuda::getStreamFromPool(false, device_.index()));
  try {
    for (int64_t first = 0; first < n; first += kSliceChunks) {
      const int64_t m = std::min(kSliceChunks, n - first);
      // Chunk i's layer l is row i * layers + l: a chunk is its layers' blocks back to back.
      at::Tensor src = at::empty({m * layers, from_bytes}, at::kByte);
      auto* base = static_cast<std::byte*>(src.data_ptr());
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(base + i * layers * from_bytes, in[first + i],
                    static_cast<size_t>(layers * from_bytes));
      }
      const at::Tensor work = cuda ? src.to(device_) : src;
      // Encoded chunks decode to float32 on the way to another codec, as the reference does.
      const at::Tensor blocks =
          from ? kernels::unpack_kv_blocks(work, *from, heads, block, dim, to ? at::kFloat : dtype_,
                                           kernel_report_.backend(KernelOp::kUnpackKvBlocks))
               : work.view(dtype_).view({m * layers, 2, heads, block, dim});
      const at::Tensor dst = (to ? kernels::pack_kv_blocks(
                                       blocks, *to, kernel_report_.backend(KernelOp::kPackKvBlocks))
                                 : blocks.to(dtype_).contiguous().view(at::kByte))
                                 .cpu()
                                 .contiguous();
      const auto* result = static_cast<const std::byte*>(dst.data_ptr());
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(out[first + i], result + i * layers * to_bytes,
                    static_cast<size_t>(layers * to_bytes));
      }
    }
  } catch (const std::exception& e) {
    return internal_error(std::string("re-encoding KV chunks: ") + e.what());
  }
  return Status();
}

int64_t TorchExecutor::kv_chunk_bytes(const kv::krul::MergedForm& form) const {
  return kernels::aten::krul_merged_chunk_bytes(form, kv_geometry_.num_layers, config_.num_kv_heads,
                                                kv_geometry_.block_size_tokens, config_.head_dim,
                                                static_cast<int64_t>(c10::elementSize(dtype_)));
}

Status TorchExecutor::merge_kv_chunks(const kv::krul::MergedForm& form,
                                      const std::vector<kv::krul::LayerPair>& pairs,
                                      std::span<const std::byte* const> in,
                                      std::span<std::byte* const> out) const {
  return convert_merged(form, pairs, in, out, /*merge=*/true, 0,
                        static_cast<int32_t>(kv_geometry_.num_layers));
}

Status TorchExecutor::unmerge_kv_chunks(const kv::krul::MergedForm& form,
                                        const std::vector<kv::krul::LayerPair>& pairs,
                                        std::span<const std::byte* const> in,
                                        std::span<std::byte* const> out, int32_t layer_begin,
                                        int32_t layer_end) const {
  return convert_merged(form, pairs, in, out, /*merge=*/false, layer_begin, layer_end);
}

Status TorchExecutor::convert_merged(const kv::krul::MergedForm& form,
                                     const std::vector<kv::krul::LayerPair>& pairs,
                                     std::span<const std::byte* const> in,
                                     std::span<std::byte* const> out, bool merge,
                                     int32_t layer_begin, int32_t layer_end) const {
  const int64_t layers = kv_geometry_.num_layers, heads = config_.num_kv_heads;
  const int64_t block = kv_geometry_.block_size_tokens, dim = config_.head_dim;
  STRATA_RETURN_IF_ERROR(kv::krul::validate_pairs(pairs, static_cast<int32_t>(layers)));
  if (std::ssize(pairs) != form.pairs) {
    return invalid_argument_error("merged KV chunks of " + std::to_string(form.pairs) +
                                  " layer pairs, given " + std::to_string(pairs.size()));
  }
  if (layer_begin < 0 || layer_begin > layer_end || layer_end > layers) {
    return invalid_argument_error("restoring layers [" + std::to_string(layer_begin) + ", " +
                                  std::to_string(layer_end) + ") of " + std::to_string(layers));
  }
  const int64_t from = merge ? kv_chunk_bytes() : kv_chunk_bytes(form);
  const int64_t to = merge ? kv_chunk_bytes(form) : kv_chunk_bytes();
  // The bytes of out[i] written: all of a merged chunk, the asked layers of a restored one.
  const int64_t written_from = merge ? 0 : layer_begin * (to / layers);
  const int64_t written = merge ? to : (layer_end - layer_begin) * (to / layers);
  // The bytes of in[i] read: all of a raw chunk; of a merged one, from layer_begin's place to
  // layer_end's, or further to the deep layer of a pair whose shallow layer is asked for.
  int64_t read_from = 0, read_to = from;
  if (!merge) {
    const int64_t layer_bytes = to / layers;
    const int64_t side_bytes =
        form.pairs == 0 ? 0 : (from - (layers - form.pairs) * layer_bytes) / form.pairs;
    const auto place = [&](int32_t l) {
      return kv::krul::merged_layer_offset(pairs, l, layer_bytes, side_bytes);
    };
    read_from = place(layer_begin);
    read_to = place(layer_end);
    for (const kv::krul::LayerPair& p : pairs) {
      if (p.shallow >= layer_begin && p.shallow < layer_end) {
        read_to = std::max(read_to, place(p.deep + 1));
      }
    }
  }
  // A slice of chunks at a time bounds the host memory this takes beside the store's.
  constexpr int64_t kSliceChunks = 16;
  try {
    for (int64_t first = 0; first < std::ssize(in); first += kSliceChunks) {
      const int64_t m = std::min(kSliceChunks, std::ssize(in) - first);
      at::Tensor src = at::empty({m, from}, at::kByte);
      auto* base = static_cast<std::byte*>(src.data_ptr());
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(base + i * from + read_from, in[first + i] + read_from,
                    static_cast<size_t>(read_to - read_from));
      }
      const at::Tensor result =
          merge ? kernels::aten::krul_merge_chunks(
                      src.view(dtype_).view({m, layers, 2, heads, block, dim}), form, pairs)
                : kernels::aten::krul_unmerge_chunks(src, form, pairs, layers, heads, block, dim,
                                                     dtype_, layer_begin, layer_end)
                      .contiguous();
      const auto* bytes = static_cast<const std::byte*>(result.data_ptr());
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(out[first + i] + written_from, bytes + i * written,
                    static_cast<size_t>(written));
      }
    }
  } catch (const std::exception& e) {
    return internal_error(std::string(merge ? "merging" : "restoring merged") +
                          " KV chunks: " + e.what());
  }
  return Status();
}

Status TorchExecutor::keep_heavy_hitters(std::span<const float> token_mass,
                                         std::span<const std::byte* const> in,
                                         std::span<std::byte* const> out) const {
  const int64_t layers = kv_geometry_.num_layers, heads = config_.num_kv_heads;
  const int64_t block = kv_geometry_.block_size_tokens, dim = config_.head_dim;
  const int64_t layer_bytes =
      2 * heads * block * dim * static_cast<int64_t>(at::elementSize(dtype_));
  if (kv_chunk_bytes() != layers * layer_bytes) {
    return failed_precondition_error(
        "H2O keeps chunks in the compute dtype, not a quantized pool's");
  }
  if (token_mass.size() % static_cast<size_t>(layers * heads) != 0 || out.empty() ||
      out.size() > in.size()) {
    return invalid_argument_error("H2O: " + std::to_string(token_mass.size()) +
                                  " token mass values for " + std::to_string(layers) + "x" +
                                  std::to_string(heads) + ", " + std::to_string(in.size()) +
                                  " chunks kept as " + std::to_string(out.size()));
  }
  try {
    const auto n = static_cast<int64_t>(in.size());
    const auto tokens = static_cast<int64_t>(token_mass.size()) / (layers * heads);
    const at::Tensor mass =
        at::from_blob(const_cast<float*>(token_mass.data()), {tokens, layers, heads}, at::kFloat);
    // A layer at a time (each layer and head chooses its own tokens): the host memory this takes
    // beside the store's is a few copies of one layer of the item, not of all of it.
    at::Tensor layer = at::empty({n, layer_bytes}, at::kByte);
    auto* base = static_cast<std::byte*>(layer.data_ptr());
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(base + i * layer_bytes, in[i] + l * layer_bytes,
                    static_cast<size_t>(layer_bytes));
      }
      const at::Tensor kept =
          kernels::aten::h2o_keep_chunks(layer.view(dtype_).view({n, 1, 2, heads, block, dim}),
                                         mass.narrow(1, l, 1), std::ssize(out));
      const auto* result = static_cast<const std::byte*>(kept.data_ptr());
      for (size_t j = 0; j < out.size(); ++j) {
        std::memcpy(out[j] + l * layer_bytes, result + static_cast<int64_t>(j) * layer_bytes,
                    static_cast<size_t>(layer_bytes));
      }
    }
  } catch (const std::exception& e) {
    return internal_error(std::string("keeping H2O's heavy hitters: ") + e.what());
  }
  return Status();
}

}  // namespace strata::executor
