// Krul's reads beside the pass of layer-merged chunks (src/restore/streamed_read.h over
// KvStore::pin_layers), on the default model's executor: a conversation merged as serving merges
// it (the store's codecs and transcoder from restore::configure_item_codecs: the layer-merge
// codec, Executor::merge_kv_chunks), held by the SSD tier only after a restart (raw or zstd) or
// still in DRAM, is read for a pyramid plan whose pairs straddle its boundaries, each range
// restored on the read thread by Executor::unmerge_kv_chunks. Every (chunk, layer) that loads is
// handed over exactly as restoring the whole chunk gives it, and a raw SSD tier is asked for only
// the merged bytes of the layers that load.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>
#include <vector>

#include "item_codecs.h"
#include "streamed_read.h"
#include "strata/executor/executor.h"
#include "strata/kv/krul_policy.h"
#include "strata/kv/prefix_hash.h"
#include "strata/model/model_source.h"
#include "support/temp_dir.h"

namespace strata::restore {
namespace {

constexpr int64_t kChunks = 4;

enum class Held { kSsd, kZstdSsd, kDram };

class StreamedMergedReadTest : public testing::TestWithParam<Held> {};

TEST_P(StreamedMergedReadTest, EveryLoadingLayerArrivesAsTheWholeChunkRestoresIt) {
  const Held held = GetParam();
  auto source = model::open_model_source(STRATA_TEST_MODEL).value();
  executor::ExecutorOptions options;
  options.cache_bytes = int64_t{400} << 20;
  auto executor = executor::Executor::create(*source, options).value();
  const kv::KvGeometry& g = executor->kv_geometry();
  const auto layers = static_cast<int32_t>(g.num_layers);
  const int64_t raw_bytes = executor->kv_chunk_bytes(), layer_bytes = raw_bytes / layers;

  // Three pairs (layer_share 0.2 of 30 layers) chosen to straddle the plan's boundaries below.
  store::StoreConfig config;
  config.dram_bytes = int64_t{16} << 20;
  config.ssd_bytes = int64_t{64} << 20;
  config.adaptcache.fixed_codec = "layer-merge";
  config.layer_pairing = store::LayerPairing::kKrul;
  config.layer_share = 0.2;
  const kv::krul::MergedForm form = merged_form(config, *executor);
  ASSERT_EQ(form.pairs, 3);
  const std::vector<kv::krul::LayerPair> pairs = {{2, 9, 0.0}, {10, 11, 0.0}, {20, 28, 0.0}};
  // Layer l loads chunks [first[l], kChunks): layers 0-4 chunk 3, 5-11 chunks 2-3, 12-20 chunks
  // 1-3, 21-29 all. So pair (2, 9)'s shallow layer loads less than its deep one, (20, 28)'s too.
  std::vector<int64_t> first(static_cast<size_t>(layers));
  for (int32_t l = 0; l < layers; ++l) first[l] = l < 5 ? 3 : l < 12 ? 2 : l < 21 ? 1 : 0;

  test_util::TempDir dir;
  config.ssd_dir = dir.file("kv");
  if (held == Held::kZstdSsd) config.ssd_codec = store::CodecKind::kZstd;
  store::StoreOptions store_options = store::StoreOptions::from_config(config);
  store_options.chunk_bytes = raw_bytes;
  store_options.block_size_tokens = g.block_size_tokens;
  store_options.chunk_layers = layers;
  store_options.layout_tag = 11;
  store_options.ttl = std::chrono::seconds(0);
  ASSERT_TRUE(configure_item_codecs(config, *executor, 0, &store_options).ok());
  const int64_t merged_bytes = executor->kv_chunk_bytes(form);

  // The conversation: random KV in the executor's dtype, saved, merged, written to the SSD.
  at::manual_seed(3);
  ASSERT_EQ(executor->dtype(), DType::kFloat32) << "the default model's pool on the CPU";
  const at::Tensor raw = at::randn({kChunks, raw_bytes / 4}).view(at::kByte);
  std::vector<TokenId> tokens;
  for (int64_t i = 0; i < kChunks * g.block_size_tokens; ++i) tokens.push_back(100 + i);
  const kv::ChunkHash root = kv::prefix_root(1, executor->kv_format(), g.block_size_tokens, "");
  std::vector<kv::ChunkHash> chain;
  for (int64_t b = 0; b < kChunks; ++b) {
    chain.push_back(kv::chain_hash(b == 0 ? root : chain.back(),
                                   std::span(tokens).subspan(b * g.block_size_tokens,
                                                             g.block_size_tokens)));
  }
  auto store = store::KvStore::open(store_options).value();
  StatusOr<store::SaveTicket> ticket = store->begin_save({"", true, 0, chain, 0, 0});
  ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
  const store::ItemId item = ticket->item;
  for (int64_t b = 0; b < kChunks; ++b) {
    std::memcpy(ticket->destinations[b], raw[b].data_ptr(), static_cast<size_t>(raw_bytes));
  }
  store->commit_save(*std::move(ticket), nullptr, 0);
  store->set_layer_pairs(item, pairs);
  store->wait_idle();
  ASSERT_EQ(store->stats().codec_items[store_options.fixed_codec], 1) << "merged";
  const store::TierIndex tier = held == Held::kDram ? store::kDramTier : 1;
  if (tier > store::kDramTier) {
    store.reset();  // the shutdown writes it to the SSD
    store = store::KvStore::open(store_options).value();
  }
  tokens.push_back(7);  // a prompt leaves its last token to compute
  const std::optional<store::StoreMatch> match = store->find(tokens, root, {});
  ASSERT_TRUE(match && match->num_chunks == kChunks && match->tier == tier);

  // What restoring the whole merged chunks gives (merging is deterministic: the store's bytes).
  std::vector<std::vector<std::byte>> merged(kChunks, std::vector<std::byte>(merged_bytes));
  std::vector<std::vector<std::byte>> whole(kChunks, std::vector<std::byte>(raw_bytes));
  std::vector<const std::byte*> raw_in, merged_in;
  std::vector<std::byte*> merged_out, whole_out;
  for (int64_t b = 0; b < kChunks; ++b) {
    raw_in.push_back(static_cast<const std::byte*>(raw[b].data_ptr()));
    merged_out.push_back(merged[b].data());
    merged_in.push_back(merged[b].data());
    whole_out.push_back(whole[b].data());
  }
  ASSERT_TRUE(executor->merge_kv_chunks(form, pairs, raw_in, merged_out).ok());
  ASSERT_TRUE(executor->unmerge_kv_chunks(form, pairs, merged_in, whole_out, 0, layers).ok());

  StatusOr<store::LayeredLease> lease = store->pin_layers(match->item, 0, kChunks);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  ASSERT_EQ(lease->from, std::vector<store::TierIndex>(kChunks, tier));
  const int64_t before = store->stats().tier("ssd").bytes_out;
  StreamedRead read(*store, *std::move(lease), first,
                    [&](std::span<const std::byte* const> in, std::span<std::byte* const> out,
                        int32_t begin, int32_t end) {
                      return executor->unmerge_kv_chunks(form, pairs, in, out, begin, end);
                    });
  read.start();
  for (int32_t l = 0; l < layers; ++l) {
    for (int64_t j = first[l]; j < kChunks; ++j) {
      const std::byte* chunk = read.wait(j, l);
      ASSERT_NE(chunk, nullptr) << "chunk " << j << " layer " << l;
      EXPECT_EQ(std::memcmp(chunk + l * layer_bytes, whole[j].data() + l * layer_bytes,
                            static_cast<size_t>(layer_bytes)),
                0)
          << "chunk " << j << " layer " << l;
    }
  }
  StreamedRead::Outcome outcome = read.finish();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status.to_string();
  // Chunk j's merged bytes from the place of the first layer that loads it; every (chunk, layer)
  // that loads restored once.
  const int64_t side_bytes = (merged_bytes - (layers - form.pairs) * layer_bytes) / form.pairs;
  int64_t expected = 0, loading = 0;
  for (int64_t j = 0; j < kChunks; ++j) {
    int32_t from = 0;
    while (first[from] > j) ++from;
    expected += merged_bytes - kv::krul::merged_layer_offset(pairs, from, layer_bytes, side_bytes);
    loading += layers - from;
  }
  if (held == Held::kSsd) {
    EXPECT_EQ(store->stats().tier("ssd").bytes_out - before, expected);
    EXPECT_DOUBLE_EQ(outcome.chunks,
                     static_cast<double>(expected) / static_cast<double>(raw_bytes));
  }
  EXPECT_EQ(outcome.restored_layers, loading);
  EXPECT_GT(outcome.restore_seconds, 0);
  store->release(outcome.lease, 0);
}

INSTANTIATE_TEST_SUITE_P(Tiers, StreamedMergedReadTest,
                         testing::Values(Held::kSsd, Held::kZstdSsd, Held::kDram),
                         [](const testing::TestParamInfo<Held>& info) {
                           return info.param == Held::kSsd       ? "Ssd"
                                  : info.param == Held::kZstdSsd ? "ZstdSsd"
                                                                 : "Dram";
                         });

}  // namespace
}  // namespace strata::restore
