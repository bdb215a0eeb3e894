// The SSD tier survives corruption anywhere in its journal and its data files: a bad record is
// skipped to the next whole one (the header is written twice), so every good record keeps its
// conversation; a corrupt data page loses only the conversation it belongs to, detected by its
// checksum and never served. Corruption at the start, middle and end of each file, and two bytes
// in the middle of the journal (the hardening issue's probe, which lost 73 of 77 conversations).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <vector>

#include "store_test_util.h"

namespace strata::store {
namespace {

constexpr int kConversations = 24;
constexpr int64_t kTokens = 13;  // 3 full blocks: 3 chunks each

// DRAM for 16 chunks, demoting below 8 free; SSD for 128.
StoreOptions ssd_options(const TempDir& dir) {
  StoreOptions o = options(&dir, 16, 128);
  o.dram_reserve_fraction = 0.5;
  o.policy = EvictionPolicy::kLru;
  return o;
}

// A store directory whose SSD tier holds every conversation (demoted, or written down by the
// clean shutdown).
void fill_store(const TempDir& dir) {
  auto store = KvStore::open(ssd_options(dir)).value();
  for (int c = 0; c < kConversations; ++c) {
    ASSERT_TRUE(save(*store, tokens(100 + c, kTokens)).ok());
    store->wait_idle();
  }
}

void flip(const std::string& path, int64_t offset, int bytes = 1) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  for (int i = 0; i < bytes; ++i) {
    f.seekg(offset + i);
    char c = 0;
    f.read(&c, 1);
    f.seekp(offset + i);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
}

// Conversations that load whole with the right bytes after a reopen (a corrupt chunk is detected
// on load and never served: load_and_check fails the test if one were).
int whole_conversations(const TempDir& dir, int64_t* corrupt = nullptr) {
  auto store = KvStore::open(ssd_options(dir)).value();
  int whole = 0;
  for (int c = 0; c < kConversations; ++c) {
    std::vector<TokenId> next = tokens(100 + c, kTokens);
    next.push_back(1);
    std::optional<StoreMatch> m = store->find(next, root(), {});
    if (!m || m->num_chunks != 3) continue;
    StatusOr<StoreLease> lease = store->acquire(m->item, 0, m->num_chunks);
    if (!lease.ok()) {
      EXPECT_EQ(lease.status().code(), StatusCode::kDataLoss) << lease.status().to_string();
      continue;
    }
    const std::vector<kv::ChunkHash> hashes = chain(next);
    bool right = true;
    for (int64_t i = 0; i < 3; ++i) right = right && holds(lease->chunks[i], hashes[i]);
    EXPECT_TRUE(right) << "conversation " << c << " served wrong bytes";
    store->release(*lease, 0);
    whole += right ? 1 : 0;
  }
  if (corrupt != nullptr) *corrupt = store->stats().corrupt_chunks;
  return whole;
}

class SsdJournalTest : public ::testing::TestWithParam<double> {};

TEST_P(SsdJournalTest, ACorruptJournalRecordLosesAtMostItsOwnConversation) {
  TempDir dir;
  fill_store(dir);
  const std::string journal = dir.file("ssd/index.journal");
  const auto size = static_cast<int64_t>(std::filesystem::file_size(journal));
  // Start: inside the first header; middle; end: the last record's checksum.
  const int64_t offset = std::min<int64_t>(size - 3, static_cast<int64_t>(GetParam() * size) + 20);
  flip(journal, offset, 2);
  EXPECT_GE(whole_conversations(dir), kConversations - 1);
  // The rewritten journal keeps them: a second reopen finds the same.
  EXPECT_GE(whole_conversations(dir), kConversations - 1);
}

INSTANTIATE_TEST_SUITE_P(StartMiddleEnd, SsdJournalTest, ::testing::Values(0.0, 0.5, 1.0));

TEST(SsdJournalTest, GarbageInTheMiddleOfTheJournalIsSkipped) {
  TempDir dir;
  fill_store(dir);
  const std::string journal = dir.file("ssd/index.journal");
  const auto size = static_cast<int64_t>(std::filesystem::file_size(journal));
  flip(journal, size / 3, 200);  // several records
  const int whole = whole_conversations(dir);
  EXPECT_GE(whole, kConversations - 4);
  EXPECT_LT(whole, kConversations);
}

// Offset of the first record of `type` (3: DROP) in a journal, by its sync word.
int64_t first_record(const std::string& path, uint32_t type) {
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t at = 0; (at = data.find("STVK", at)) != std::string::npos; ++at) {
    uint32_t t = 0;
    std::memcpy(&t, data.data() + at + 8, sizeof(t));
    if (t == type) return static_cast<int64_t>(at);
  }
  return -1;
}

TEST(SsdJournalTest, APageWhoseDropWasLostBelongsToTheLaterConversation) {
  TempDir dir;
  StoreOptions o = options(&dir, 4, 3);  // the SSD holds one conversation: B replaces A there
  o.dram_reserve_fraction = 0.5;
  o.policy = EvictionPolicy::kLru;
  const std::vector<TokenId> a = tokens(200, kTokens), b = tokens(201, kTokens);
  {
    auto store = KvStore::open(o).value();
    ASSERT_TRUE(save(*store, a).ok());
    store->wait_idle();
    ASSERT_TRUE(save(*store, b).ok());
    store->wait_idle();
    EXPECT_EQ(store->stats().tier("ssd").evictions, 1);
  }
  const std::string journal = dir.file("ssd/index.journal");
  const int64_t drop = first_record(journal, 3);
  ASSERT_GT(drop, 0);
  flip(journal, drop + 14);  // A's DROP is lost: A's and B's PUTs name the same pages
  auto store = KvStore::open(o).value();
  EXPECT_TRUE(load_and_check(*store, b));
  EXPECT_FALSE(store->find(a, root(), {}).has_value()) << "A's pages hold B's chunks now";
}

TEST(SsdJournalTest, ACorruptDataPageLosesOnlyItsConversation) {
  for (const double where : {0.0, 0.5, 1.0}) {
    SCOPED_TRACE(where);
    TempDir dir;
    fill_store(dir);
    // The pages in use: 3 chunks of 2 pages per conversation, filling the 32-page data files
    // (options(): 128 KiB each) in order.
    const int64_t used_pages = kConversations * 3 * 2;
    const int64_t page = std::min<int64_t>(used_pages - 1, static_cast<int64_t>(where * used_pages));
    char file[32];
    std::snprintf(file, sizeof(file), "ssd/data-%03lld.bin", static_cast<long long>(page / 32));
    flip(dir.file(file), (page % 32) * 4096 + 100);
    int64_t corrupt = 0;
    EXPECT_EQ(whole_conversations(dir, &corrupt), kConversations - 1);
    EXPECT_EQ(corrupt, 1);
  }
}

}  // namespace
}  // namespace strata::store
