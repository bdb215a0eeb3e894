// Reads by layer ranges (KvStore::pin_layers, read_layers; SsdTier::get_part): Krul's restoration
// reads each layer's part of a conversation's chunks just before the layer that loads it. The
// SSD tier reads only the bytes asked for, checked by the checksum of each layer segment, so a
// corrupt layer is refused even when the rest of its chunk is good, a read error drops its item
// and fails the tier; a tier that cannot read parts (zstd) reads a chunk whole the first time.
// Chunks of 6000 bytes in 6 layers of 1000: parts do not start on pages, so the tier reads the
// pages around them. Krul's stored suffix: chunks keeping only their last layers below DRAM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "store_test_util.h"
#include "strata/kv/krul_policy.h"
#include "strata/store/ssd_tier.h"
#include "support/fault_env.h"

namespace strata::store {
namespace {

constexpr int32_t kLayers = 6;
constexpr int64_t kLayerBytes = kChunkBytes / kLayers;

// DRAM of 4 chunks, a quarter kept free, over one SSD tier: the second 2-chunk item sends the
// first one down.
StoreOptions layered(const TempDir& dir, CodecKind codec = CodecKind::kIdentity,
                     Env* env = Env::posix()) {
  StoreOptions o = options(nullptr, 4);
  o.chunk_layers = kLayers;
  o.dram_reserve_fraction = 0.25;
  o.tiers.push_back({.name = "ssd",
                     .dir = dir.file("ssd"),
                     .capacity_bytes = 64 * 8192,
                     .file_bytes = 16 * 8192,
                     .codec = codec,
                     .env = env});
  return o;
}

// Whether bytes [begin, end) x kLayerBytes of `chunk` are those of the chunk hashed `h`.
bool holds_layers(const std::byte* chunk, const kv::ChunkHash& h, int64_t begin, int64_t end) {
  std::vector<std::byte> want(kChunkBytes);
  fill(want.data(), h);
  return std::memcmp(chunk + begin * kLayerBytes, want.data() + begin * kLayerBytes,
                     static_cast<size_t>((end - begin) * kLayerBytes)) == 0;
}

// Saves `a` then another item, so that `a` is held by the SSD tier only.
void save_a_on_the_ssd(KvStore& store, std::span<const TokenId> a) {
  ASSERT_TRUE(save(store, a).ok());
  store.wait_idle();
  ASSERT_TRUE(save(store, tokens(2, 9)).ok());
  store.wait_idle();
  ASSERT_EQ(store.find(a, root(), {})->tier, kSsd);
}

TEST(LayeredReadTest, TheSsdTierReadsOnlyTheLayersAskedFor) {
  TempDir dir;
  auto store = KvStore::open(layered(dir)).value();
  const std::vector<TokenId> a = tokens(1, 9);
  save_a_on_the_ssd(*store, a);
  const std::vector<kv::ChunkHash> hashes = chain(a);
  const std::optional<StoreMatch> m = store->find(a, root(), {});
  const int64_t before = store->stats().tier("ssd").bytes_out;
  StatusOr<LayeredLease> lease = store->pin_layers(m->item, 0, 2);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_EQ(lease->from, (std::vector<TierIndex>{kSsd, kSsd}));
  EXPECT_EQ(lease->lease.served_from, kSsd);
  EXPECT_EQ(store->stats().tier("ssd").bytes_out, before) << "pinning reads nothing";
  const std::vector<LayerPart> parts = {{0, 2, 4}, {1, 5, 6}, {1, 0, 1}};
  ASSERT_TRUE(store->read_layers(&*lease, parts).ok());
  EXPECT_TRUE(holds_layers(lease->lease.chunks[0], hashes[0], 2, 4));
  EXPECT_TRUE(holds_layers(lease->lease.chunks[1], hashes[1], 5, 6));
  EXPECT_TRUE(holds_layers(lease->lease.chunks[1], hashes[1], 0, 1));
  EXPECT_EQ(store->stats().tier("ssd").bytes_out - before, 4 * kLayerBytes);
  // The rest of the chunks later, into the same buffers: each chunk whole and right.
  ASSERT_TRUE(
      store->read_layers(&*lease, std::vector<LayerPart>{{0, 0, 2}, {0, 4, 6}, {1, 1, 5}}).ok());
  EXPECT_TRUE(holds(lease->lease.chunks[0], hashes[0]));
  EXPECT_TRUE(holds(lease->lease.chunks[1], hashes[1]));
  store->release(lease->lease, 0);
  EXPECT_EQ(store->find(a, root(), {})->tier, kSsd) << "parts read are not copied into DRAM";
  EXPECT_TRUE(load_and_check(*store, a));
}

TEST(LayeredReadTest, ChunksInDramAreHandedOverWhole) {
  TempDir dir;
  auto store = KvStore::open(layered(dir)).value();
  const std::vector<TokenId> a = tokens(1, 9);
  ASSERT_TRUE(save(*store, a).ok());
  const std::optional<StoreMatch> m = store->find(a, root(), {});
  StatusOr<LayeredLease> lease = store->pin_layers(m->item, 0, 2);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->from, (std::vector<TierIndex>{kDramTier, kDramTier}));
  EXPECT_EQ(lease->lease.served_from, kDramTier);
  // Nothing to read: parts of whole chunks are skipped.
  ASSERT_TRUE(store->read_layers(&*lease, std::vector<LayerPart>{{0, 0, 6}}).ok());
  EXPECT_TRUE(holds(lease->lease.chunks[0], chain(a)[0]));
  store->release(lease->lease, 0);
  EXPECT_EQ(store->pin_layers(m->item, 0, 3).status().code(), StatusCode::kNotFound)
      << "a longer range than the item holds";
}

TEST(LayeredReadTest, ACorruptLayerIsRefusedAndTheRestOfItsChunkServed) {
  TempDir dir;
  const std::vector<TokenId> a = tokens(1, 9);
  const kv::ChunkHash first = chain(a)[0];
  {
    auto store = KvStore::open(layered(dir)).value();
    save_a_on_the_ssd(*store, a);
  }
  // Flip a byte of chunk 0's layer 3 where the tier wrote it (found by its content).
  std::vector<std::byte> want(kChunkBytes);
  fill(want.data(), first);
  const std::string path = dir.file("ssd") + "/data-000.bin";
  std::vector<char> data;
  {
    std::ifstream in(path, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto* pattern = reinterpret_cast<const char*>(want.data()) + 3 * kLayerBytes;
  const auto at = std::search(data.begin(), data.end(), pattern, pattern + kLayerBytes);
  ASSERT_NE(at, data.end());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(at - data.begin() + 10);
    const char c = static_cast<char>(data[at - data.begin() + 10] ^ 0x5a);
    f.write(&c, 1);
  }
  auto store = KvStore::open(layered(dir)).value();
  const std::optional<StoreMatch> m = store->find(a, root(), {});
  ASSERT_TRUE(m.has_value());
  StatusOr<LayeredLease> lease = store->pin_layers(m->item, 0, 2);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store->read_layers(&*lease, std::vector<LayerPart>{{0, 0, 3}, {0, 4, 6}}).ok())
      << "the good layers of the chunk";
  EXPECT_TRUE(holds_layers(lease->lease.chunks[0], first, 0, 3));
  EXPECT_TRUE(holds_layers(lease->lease.chunks[0], first, 4, 6));
  EXPECT_EQ(store->read_layers(&*lease, std::vector<LayerPart>{{0, 3, 4}}).code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(store->stats().corrupt_chunks, 1);
  store->release(lease->lease, 0);
  EXPECT_FALSE(store->find(a, root(), {})) << "its item is dropped";
}

// A read error fails the tier: the part's read drops its item, and an item whose chunks only the
// failed tier holds is refused at the pin, without touching the disk.
TEST(LayeredReadTest, AReadErrorDropsTheItemAndAFailedTierPinsNothing) {
  TempDir dir;
  test_util::FaultEnv env;
  auto store = KvStore::open(layered(dir, CodecKind::kIdentity, &env)).value();
  const std::vector<TokenId> a = tokens(1, 9), b = tokens(2, 9), c = tokens(3, 9);
  for (const auto& t : {a, b, c}) {  // a and b are demoted: only on the SSD
    ASSERT_TRUE(save(*store, t).ok());
    store->wait_idle();
  }
  const std::optional<StoreMatch> ma = store->find(a, root(), {}), mb = store->find(b, root(), {});
  ASSERT_TRUE(ma && mb);
  ASSERT_EQ(mb->tier, kSsd);
  StatusOr<LayeredLease> lease = store->pin_layers(ma->item, 0, 2);
  ASSERT_TRUE(lease.ok());
  env.inject(test_util::FaultEnv::Fault::kReadError, "data-");
  EXPECT_EQ(store->read_layers(&*lease, std::vector<LayerPart>{{0, 0, 1}}).code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(env.remaining(), 0);
  EXPECT_FALSE(store->stats().tier("ssd").available);
  EXPECT_EQ(store->stats().tier("ssd").bytes_out, 0) << "a failed read counts no bytes";
  store->release(lease->lease, 0);
  EXPECT_FALSE(store->find(a, root(), {})) << "its item is dropped";
  EXPECT_EQ(store->pin_layers(mb->item, 0, 2).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(store->stats().corrupt_chunks, 2);
  EXPECT_TRUE(load_and_check(*store, c)) << "DRAM still serves";
}

TEST(LayeredReadTest, ATierThatCannotReadPartsReadsAChunkWholeOnce) {
  TempDir dir;
  auto store = KvStore::open(layered(dir, CodecKind::kZstd)).value();
  const std::vector<TokenId> a = tokens(1, 9);
  save_a_on_the_ssd(*store, a);
  const std::optional<StoreMatch> m = store->find(a, root(), {});
  StatusOr<LayeredLease> lease = store->pin_layers(m->item, 0, 2);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store->read_layers(&*lease, std::vector<LayerPart>{{1, 2, 3}}).ok());
  EXPECT_EQ(lease->from, (std::vector<TierIndex>{kSsd, kDramTier})) << "chunk 1 is whole now";
  EXPECT_TRUE(holds(lease->lease.chunks[1], chain(a)[1]));
  const int64_t read = store->stats().tier("ssd").bytes_out;
  ASSERT_TRUE(store->read_layers(&*lease, std::vector<LayerPart>{{1, 0, 6}}).ok());
  EXPECT_EQ(store->stats().tier("ssd").bytes_out, read) << "and not read again";
  store->release(lease->lease, 0);
}

// A part of a value is read with the checksummed segments around it: any byte range reads back
// its bytes, and fails when a segment it touches is corrupt, not when another one is. A value
// whose size is not a multiple of the segments' has a shorter last one, after a restart too.
TEST(LayeredReadTest, APartIsCheckedByTheSegmentsAroundIt) {
  TempDir dir;
  std::vector<RecoveredItem> recovered;
  const SsdOptions ssd{.name = "ssd",
                       .dir = dir.file("ssd"),
                       .capacity_bytes = 64 * 8192,
                       .file_bytes = 16 * 8192,
                       .segment_bytes = kLayerBytes};
  auto tier = SsdTier::open(ssd, &recovered).value();
  // A value of 6 segments, and one of 5500 bytes (6 segments: 5 of 917 bytes, a last of 915).
  const std::vector<int64_t> sizes = {kChunkBytes, 5500};
  Reservation room = tier->reserve(sizes).value();
  std::vector<AlignedBuffer> values;
  std::vector<std::span<const std::byte>> spans;
  for (size_t i = 0; i < sizes.size(); ++i) {
    AlignedBuffer& v = values.emplace_back(kChunkBytes);
    fill(v.data(), {i + 1, 7});
    spans.emplace_back(v.data(), static_cast<size_t>(sizes[i]));
  }
  const std::vector<ChunkKey> keys = {{1, 0, {1, 7}}, {1, 1, {2, 7}}};
  ASSERT_TRUE(tier->put({}, room, keys, spans).ok());
  tier.reset();  // both values and their checksums come back from the journal
  tier = SsdTier::open(ssd, &recovered).value();
  ASSERT_EQ(recovered.size(), 1u);
  std::vector<std::byte> out(kChunkBytes);
  const auto reads = [&](int32_t index, int64_t offset, int64_t bytes) {
    std::ranges::fill(out, std::byte{0});
    const Status read = tier->get_part(1, index, offset, bytes, out.data());
    return read.ok() && std::memcmp(out.data(), values[index].data() + offset, bytes) == 0;
  };
  EXPECT_TRUE(reads(0, 2 * kLayerBytes, 3 * kLayerBytes));
  EXPECT_TRUE(reads(0, kLayerBytes / 2, kLayerBytes));
  EXPECT_TRUE(reads(0, 5 * kLayerBytes + 1, kLayerBytes - 1));
  EXPECT_TRUE(reads(1, 0, 5500));
  EXPECT_TRUE(reads(1, 4000, 1500));
  EXPECT_TRUE(reads(1, 917 * 5, 915)) << "the last segment";
  EXPECT_EQ(tier->get_part(1, 0, 5 * kLayerBytes, 2 * kLayerBytes, out.data()).code(),
            StatusCode::kInvalidArgument)
      << "past the value";
  EXPECT_EQ(tier->get_part(1, 2, 0, kLayerBytes, out.data()).code(), StatusCode::kNotFound);
  // Corrupt byte 2000 of the second value (its third segment, [1834, 2751)) where the tier wrote
  // it (found by its content).
  const std::string path = dir.file("ssd") + "/data-000.bin";
  std::vector<char> data;
  {
    std::ifstream in(path, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto* pattern = reinterpret_cast<const char*>(values[1].data());
  const auto at = std::search(data.begin(), data.end(), pattern, pattern + 1000);
  ASSERT_NE(at, data.end());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(at - data.begin() + 2000);
    const char c = static_cast<char>(data[at - data.begin() + 2000] ^ 0x5a);
    f.write(&c, 1);
  }
  EXPECT_TRUE(reads(1, 0, 1834));
  EXPECT_TRUE(reads(1, 2751, 100));
  EXPECT_EQ(tier->get_part(1, 1, 2700, 10, out.data()).code(), StatusCode::kDataLoss);
  EXPECT_EQ(tier->get_part(1, 1, 1800, 40, out.data()).code(), StatusCode::kDataLoss);
}

// Krul's stored suffix (KvStore::set_stored_layers): once written below DRAM, chunk i keeps only
// its layers [first_layers[i], 6). Its loads read those layers right from the SSD (by parts, or
// whole into DRAM), raw or zstd, after a restart too; a read of a layer it left out is refused.
class StoredSuffixTest : public testing::TestWithParam<CodecKind> {
 protected:
  // Saves `a` with first layers {4, 2}, then sends it down to the SSD tier; its item.
  ItemId store_a_suffix(KvStore& store, std::span<const TokenId> a) {
    EXPECT_TRUE(save(store, a).ok());
    store.wait_idle();
    const ItemId item = store.find(a, root(), {})->item;
    store.set_stored_layers(item, {4, 2, 5});  // the third chunk does not exist
    std::vector<int32_t> first_layers;
    EXPECT_TRUE(store.locate(item, 0, 2, 0, &first_layers));
    EXPECT_TRUE(first_layers.empty()) << "DRAM keeps every layer until the chunks go below";
    EXPECT_TRUE(save(store, tokens(2, 9)).ok());
    store.wait_idle();
    EXPECT_EQ(store.find(a, root(), {})->tier, kSsd);
    return item;
  }
};

TEST_P(StoredSuffixTest, ChunksKeepTheirLayersFromTheirFirstOnBelowDram) {
  TempDir dir;
  const std::vector<TokenId> a = tokens(1, 9);
  const std::vector<kv::ChunkHash> hashes = chain(a);
  {
    auto store = KvStore::open(layered(dir, GetParam())).value();
    const ItemId item = store_a_suffix(*store, a);
    if (GetParam() == CodecKind::kIdentity) {
      EXPECT_EQ(store->stats().tier("ssd").bytes_in, (2 + 4) * kLayerBytes) << "of 12 layers";
    }
    store->set_stored_layers(item, {0, 0});  // too late: written below, the chunks keep theirs
  }
  auto store = KvStore::open(layered(dir, GetParam())).value();  // the journal keeps them
  const std::optional<StoreMatch> m = store->find(a, root(), {});
  ASSERT_TRUE(m && m->num_chunks == 2);
  std::vector<int32_t> first_layers;
  ASSERT_TRUE(store->locate(m->item, 0, 2, 0, &first_layers));
  EXPECT_EQ(first_layers, (std::vector<int32_t>{4, 2}));
  StatusOr<LayeredLease> parts = store->pin_layers(m->item, 0, 2);
  ASSERT_TRUE(parts.ok()) << parts.status().to_string();
  EXPECT_EQ(parts->lease.first_layers, (std::vector<int32_t>{4, 2}));
  ASSERT_TRUE(store->read_layers(&*parts, std::vector<LayerPart>{{0, 5, 6}, {1, 2, 4}}).ok());
  ASSERT_TRUE(store->read_layers(&*parts, std::vector<LayerPart>{{0, 4, 5}, {1, 4, 6}}).ok());
  EXPECT_TRUE(holds_layers(parts->lease.chunks[0], hashes[0], 4, 6));
  EXPECT_TRUE(holds_layers(parts->lease.chunks[1], hashes[1], 2, 6));
  store->release(parts->lease, 0);
  StatusOr<StoreLease> whole = store->acquire(m->item, 0, 2);  // read into DRAM
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(whole->first_layers, (std::vector<int32_t>{4, 2}));
  EXPECT_TRUE(holds_layers(whole->chunks[0], hashes[0], 4, 6));
  EXPECT_TRUE(holds_layers(whole->chunks[1], hashes[1], 2, 6));
  store->release(*whole, 0);
  EXPECT_FALSE(store->try_acquire_in_dram(m->item, 0, 2))
      << "the read buffer pre-loads every layer of a chunk";
  first_layers.clear();
  ASSERT_TRUE(store->locate(m->item, 1, 1, 0, &first_layers));
  EXPECT_EQ(first_layers, (std::vector<int32_t>{2})) << "DRAM's copy came from the SSD";
}

TEST_P(StoredSuffixTest, AReadOfALayerTheChunkLeftOutIsRefused) {
  TempDir dir;
  auto store = KvStore::open(layered(dir, GetParam())).value();
  const std::vector<TokenId> a = tokens(1, 9);
  const ItemId item = store_a_suffix(*store, a);
  StatusOr<LayeredLease> lease = store->pin_layers(item, 0, 2);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(store->read_layers(&*lease, std::vector<LayerPart>{{1, 1, 6}}).code(),
            StatusCode::kDataLoss);
  store->release(lease->lease, 0);
  EXPECT_FALSE(store->find(a, root(), {})) << "dropped, as a corrupt chunk's item is";
}

// "merge" stands for the layer merge of pair (1, 3) with 200 bytes of magnitudes and retained
// vectors, laid out as the real one is (layer 1's place empty, layer 3's followed by the pair's
// bytes).
constexpr int64_t kPairBytes = 200, kMerged = kChunkBytes - kLayerBytes + kPairBytes;

std::vector<kv::krul::LayerPair> merged_pairs() { return {{1, 3, 0.5}}; }

StoreOptions merging(const TempDir& dir, CodecKind codec) {
  StoreOptions o = layered(dir, codec);
  o.codecs = {{.name = "merge", .chunk_bytes = kMerged, .merged_pairs = 1, .task_quality = {}}};
  o.fixed_codec = 1;
  o.transcode = [](int32_t, int32_t, const std::vector<kv::krul::LayerPair>&,
                   std::span<const std::byte* const> in, std::span<std::byte* const> out) {
    for (size_t i = 0; i < in.size(); ++i) {
      std::byte* to = out[i];
      for (int64_t l : {0, 2, 3}) to = std::copy_n(in[i] + l * kLayerBytes, kLayerBytes, to);
      to = std::copy_n(in[i] + kLayerBytes, kPairBytes, to);  // "the pair's bytes"
      std::copy_n(in[i] + 4 * kLayerBytes, 2 * kLayerBytes, to);
    }
    return Status();
  };
  return o;
}

// The merged form of the chunks of `a`.
std::vector<std::vector<std::byte>> merged_chunks(const StoreOptions& o,
                                                  std::span<const TokenId> a) {
  std::vector<std::vector<std::byte>> merged;
  for (const kv::ChunkHash& h : chain(a)) {
    std::vector<std::byte> raw(kChunkBytes);
    fill(raw.data(), h);
    std::byte* out = merged.emplace_back(kMerged).data();
    EXPECT_TRUE(o.transcode(0, 1, merged_pairs(), std::vector<const std::byte*>{raw.data()},
                            std::span<std::byte* const>(&out, 1))
                    .ok());
  }
  return merged;
}

// A layer-merged item is read by layer ranges in its merged form: layers [b, e) are its bytes
// between their places (the shallow layer 1 has none: its data is at layer 3's place), and the
// SSD tier reads just those (checked by the segments around them).
TEST_P(StoredSuffixTest, AMergedChunkIsReadByTheLayersOfItsMergedForm) {
  TempDir dir;
  const StoreOptions o = merging(dir, GetParam());
  const std::vector<TokenId> a = tokens(1, 9);
  const std::vector<std::vector<std::byte>> merged = merged_chunks(o, a);
  const std::vector<kv::krul::LayerPair> pairs = merged_pairs();
  const auto place = [&](int32_t l) {
    return kv::krul::merged_layer_offset(pairs, l, kLayerBytes, kPairBytes);
  };
  auto store = KvStore::open(o).value();
  ASSERT_TRUE(save(*store, a).ok());
  store->wait_idle();
  const ItemId item = store->find(a, root(), {})->item;
  store->set_layer_pairs(item, pairs);
  store->wait_idle();
  ASSERT_TRUE(save(*store, tokens(2, 9)).ok());
  store->wait_idle();
  ASSERT_EQ(store->find(a, root(), {})->tier, kSsd);
  std::vector<kv::krul::LayerPair> located;
  ASSERT_TRUE(store->locate(item, 0, 2, 0, nullptr, &located));
  ASSERT_EQ(located.size(), 1u);
  EXPECT_EQ(located[0].shallow, 1);
  EXPECT_EQ(located[0].deep, 3);

  StatusOr<LayeredLease> lease = store->pin_layers(item, 0, 2);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_EQ(lease->lease.codec, 1);
  ASSERT_EQ(lease->lease.layer_pairs.size(), 1u);
  const int64_t before = store->stats().tier("ssd").bytes_out;
  ASSERT_TRUE(store->read_layers(&*lease, std::vector<LayerPart>{{0, 0, 1}}).ok());
  EXPECT_TRUE(
      std::equal(lease->lease.chunks[0], lease->lease.chunks[0] + place(1), merged[0].begin()));
  ASSERT_TRUE(store->read_layers(&*lease, std::vector<LayerPart>{{0, 1, 2}}).ok());
  if (GetParam() == CodecKind::kIdentity) {
    EXPECT_EQ(store->stats().tier("ssd").bytes_out - before, place(1)) << "layer 1 holds nothing";
  }
  ASSERT_TRUE(store->read_layers(&*lease, std::vector<LayerPart>{{0, 1, 4}, {1, 1, 6}}).ok());
  EXPECT_TRUE(std::equal(lease->lease.chunks[0] + place(1), lease->lease.chunks[0] + place(4),
                         merged[0].begin() + place(1)));
  EXPECT_TRUE(std::equal(lease->lease.chunks[1] + place(1), lease->lease.chunks[1] + kMerged,
                         merged[1].begin() + place(1)));
  if (GetParam() == CodecKind::kIdentity) {
    EXPECT_EQ(store->stats().tier("ssd").bytes_out - before, place(4) + (kMerged - place(1)))
        << "chunk 0's layers [0, 4), chunk 1's [1, 6)";
  }
  store->release(lease->lease, 0);
}

// A layer-merged item keeps a stored suffix of its merged form (kv::krul::merged_layer_offset).
// Set before the merge, the first layers {4, 2} keep the merged bytes from layer 4's and layer
// 2's place on; read back after a restart, the bytes before them are zeros.
TEST_P(StoredSuffixTest, AMergedChunkKeepsTheSuffixOfItsMergedForm) {
  const std::vector<kv::krul::LayerPair> pairs = merged_pairs();
  TempDir dir;
  const StoreOptions o = merging(dir, GetParam());
  const std::vector<TokenId> a = tokens(1, 9);
  const std::vector<std::vector<std::byte>> merged = merged_chunks(o, a);
  const int64_t from4 = kv::krul::merged_layer_offset(pairs, 4, kLayerBytes, kPairBytes);
  const int64_t from2 = kv::krul::merged_layer_offset(pairs, 2, kLayerBytes, kPairBytes);
  EXPECT_EQ(from4, 3 * kLayerBytes + kPairBytes);
  EXPECT_EQ(from2, kLayerBytes);
  {
    auto store = KvStore::open(o).value();
    ASSERT_TRUE(save(*store, a).ok());
    store->wait_idle();
    const ItemId item = store->find(a, root(), {})->item;
    store->set_stored_layers(item, {4, 2});
    store->set_layer_pairs(item, pairs);
    store->wait_idle();
    EXPECT_EQ(store->stats().codec_items, (std::vector<int64_t>{0, 1})) << "merged all the same";
    ASSERT_TRUE(save(*store, tokens(2, 9)).ok());
    store->wait_idle();
    ASSERT_EQ(store->find(a, root(), {})->tier, kSsd);
    if (GetParam() == CodecKind::kIdentity) {
      EXPECT_EQ(store->stats().tier("ssd").bytes_in, (kMerged - from4) + (kMerged - from2));
    }
  }
  auto store = KvStore::open(o).value();
  const std::optional<StoreMatch> m = store->find(a, root(), {});
  ASSERT_TRUE(m && m->num_chunks == 2);
  StatusOr<StoreLease> lease = store->acquire(m->item, 0, 2);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  EXPECT_EQ(lease->codec, 1);
  EXPECT_EQ(lease->first_layers, (std::vector<int32_t>{4, 2}));
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t from = i == 0 ? from4 : from2;
    const std::byte* chunk = lease->chunks[i];
    EXPECT_TRUE(std::all_of(chunk, chunk + from, [](std::byte b) { return b == std::byte{0}; }))
        << "chunk " << i;
    EXPECT_TRUE(std::equal(chunk + from, chunk + kMerged, merged[i].begin() + from))
        << "chunk " << i;
  }
  store->release(*lease, 0);
}

INSTANTIATE_TEST_SUITE_P(Codecs, StoredSuffixTest,
                         testing::Values(CodecKind::kIdentity, CodecKind::kZstd),
                         [](const testing::TestParamInfo<CodecKind>& info) {
                           return info.param == CodecKind::kIdentity ? "Raw" : "Zstd";
                         });

}  // namespace
}  // namespace strata::store
