// Hit rate of the KV store's placement policies (scheduler-aware, LRU, FIFO) on a replay of real
// ShareGPT conversations: the CachedAttention paper's trace simulation (its Fig. 21), run against
// the real KvStore (DRAM arena, SSD files, journal, I/O thread) with every chunk scaled down to
// one 4 KiB slot. Hit rates depend only on KV bytes per token, capacities and the job queue, so
// capacities are given in the paper's units and converted to chunks of the modelled model.
//
// The workload (docs/kv-store.md, "Policy simulation", records the choices the paper leaves open):
//   - sessions are ShareGPT conversations (sampled with replacement) arriving as a Poisson
//     process; a turn is one human message and the recorded reply; tokens = chars / 4;
//   - one FCFS job queue served one job at a time; service time = computed prompt tokens /
//     prefill rate + reply tokens / decode rate (loaded history costs nothing: it overlaps);
//   - a session's next turn joins the queue when its previous turn finishes, after a think time
//     (exponential);
//   - the context window caps the prompt: the history after its first block is cut (whole blocks,
//     oldest first) so that history + new tokens + reply fit, as the engine truncates; the stored
//     item is what the turn saw plus its reply;
//   - a turn hits when its session's stored item is still in the store when the job runs (first
//     turns are not counted); warm-up turns are not counted either.
//
//   build/bench/store_policy_bench --sharegpt ../shared/data/sharegpt/sharegpt_v3_sample1000.json.xz
//       [--dir DIR] [--sessions 9000] [--warmup-turns 10000] [--dram-gb 128] [--ssd-tb 10,2]
//       [--policies scheduler_aware,lru,fifo] [--kv-bytes-per-token 819200] [--window 4096]
//       [--rate 1.0] [--think-seconds 10] [--prefill-tokens-per-s 8000]
//       [--decode-tokens-per-s 1000] [--seed 1]
// Prints one JSON object.
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <spdlog/spdlog.h>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/kv/prefix_hash.h"
#include "strata/store/kv_store.h"

namespace {

using strata::StatusOr;
using strata::TokenId;
using Json = nlohmann::json;
namespace store = strata::store;
namespace kv = strata::kv;

constexpr int64_t kBlockTokens = 16;
constexpr int64_t kSlotBytes = 4096;

struct Turn {
  int64_t user_tokens = 0;
  int64_t reply_tokens = 0;
};
using Conversation = std::vector<Turn>;

// ShareGPT records as (human, gpt) turns; records with no turn, more than 40 turns or more than
// 32K tokens are left out (the paper's Fig. 2 rule).
std::vector<Conversation> load_sharegpt(const std::string& path) {
  const std::string command = "xz -dc '" + path + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    std::cerr << "cannot run " << command << "\n";
    std::exit(1);
  }
  std::string text;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) text.append(buffer, n);
  if (::pclose(pipe) != 0 || text.empty()) {
    std::cerr << path << ": not an xz-compressed ShareGPT file\n";
    std::exit(1);
  }
  std::vector<Conversation> out;
  for (const Json& record : Json::parse(text)) {
    Conversation c;
    int64_t total = 0;
    const Json& messages = record.at("conversations");
    for (size_t i = 0; i + 1 < messages.size(); ++i) {
      if (messages[i].at("from") != "human" || messages[i + 1].at("from") != "gpt") continue;
      const Turn turn{
          std::max<int64_t>(1, messages[i].at("value").get<std::string>().size() / 4),
          std::max<int64_t>(1, messages[i + 1].at("value").get<std::string>().size() / 4)};
      total += turn.user_tokens + turn.reply_tokens;
      c.push_back(turn);
      ++i;
    }
    if (!c.empty() && c.size() <= 40 && total <= 32768) out.push_back(std::move(c));
  }
  return out;
}

struct Options {
  std::string sharegpt;
  std::string dir = (std::filesystem::temp_directory_path() / "strata_policy_bench").string();
  int sessions = 9000;
  int64_t warmup_turns = 10000;
  double dram_gb = 128;
  std::vector<double> ssd_tb = {10, 2};
  std::vector<std::string> policies = {"scheduler_aware", "lru", "fifo"};
  int64_t kv_bytes_per_token = 819200;  // LLaMA-13B in fp16: 2 x 40 layers x 5120 x 2 bytes
  int64_t window = 4096;
  double rate = 1.0;
  double think_seconds = 10;
  double prefill_tokens_per_s = 8000;
  double decode_tokens_per_s = 1000;
  uint64_t seed = 1;
};

// A session's token at a position of its conversation: any fixed pseudo-random function works,
// the store only compares hashes.
TokenId token_at(uint64_t session, int64_t position) {
  uint64_t z = session * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(position) + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<TokenId>((z ^ (z >> 31)) % 32000);
}

struct Session {
  const Conversation* conversation = nullptr;
  size_t next_turn = 0;
  int64_t history_tokens = 0;  // conversation tokens before the next turn
  // The stored item as last saved: conversation tokens [0, B) and [B + stored_drop, stored_end).
  int64_t stored_drop = 0;
  int64_t stored_end = 0;
  store::ItemId item = 0;
};

struct Result {
  int64_t counted_turns = 0;
  int64_t hits = 0;
  int64_t dram_hits = 0;
  int64_t counted_history_tokens = 0;
  int64_t hit_tokens = 0;
  double mean_queue_length = 0;
  double simulated_hours = 0;
  double gpu_hours = 0;
  store::StoreStats stats;
};

Result simulate(const Options& o, const std::vector<Conversation>& conversations,
                store::EvictionPolicy policy, double ssd_tb) {
  const int64_t chunk_kv_bytes = o.kv_bytes_per_token * kBlockTokens;
  const int64_t dram_chunks = static_cast<int64_t>(o.dram_gb * 1e9 / chunk_kv_bytes);
  const int64_t ssd_chunks = static_cast<int64_t>(ssd_tb * 1e12 / chunk_kv_bytes);
  std::filesystem::remove_all(o.dir);
  store::StoreOptions so;
  so.chunk_bytes = kSlotBytes;
  so.block_size_tokens = kBlockTokens;
  so.dram_bytes = dram_chunks * kSlotBytes;
  // Hit rates, not disk speed: buffered I/O (the page cache) keeps the run short.
  so.tiers.push_back({.name = "ssd",
                      .dir = o.dir,
                      .capacity_bytes = ssd_chunks * kSlotBytes,
                      .file_bytes = int64_t{256} << 20,
                      .direct_io = false});
  so.policy = policy;
  so.io_threads = 1;  // with wait_idle() after each event: a repeatable run
  so.ttl = std::chrono::seconds(0);  // simulated hours pass in real minutes
  auto opened = store::KvStore::open(so);
  if (!opened.ok()) {
    std::cerr << opened.status().to_string() << "\n";
    std::exit(1);
  }
  store::KvStore& kv_store = **opened;
  const kv::ChunkHash root = kv::prefix_root(0, kv::KvFormat{}, kBlockTokens, "");

  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> interarrival(o.rate);
  std::exponential_distribution<double> think(1.0 / o.think_seconds);
  std::uniform_int_distribution<size_t> pick(0, conversations.size() - 1);
  std::vector<Session> sessions(o.sessions);
  // Events: (time, session) of turns becoming ready; arrivals are first turns.
  using Event = std::pair<double, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> ready;
  double t = 0;
  for (int s = 0; s < o.sessions; ++s) {
    t += interarrival(rng);
    sessions[s].conversation = &conversations[pick(rng)];
    ready.push({t, s});
  }

  std::deque<int> queue;  // sessions whose next turn waits, in arrival order
  auto publish_queue = [&] {
    std::vector<store::ItemId> items;
    items.reserve(queue.size());
    for (int s : queue) {
      if (sessions[s].item != 0) items.push_back(sessions[s].item);
    }
    kv_store.set_queue(std::move(items));
    kv_store.wait_idle();
  };
  auto tokens = [](uint64_t session, int64_t begin, int64_t end) {
    std::vector<TokenId> out;
    out.reserve(end - begin);
    for (int64_t p = begin; p < end; ++p) out.push_back(token_at(session, p));
    return out;
  };

  Result r;
  double now = 0;
  double queue_area = 0;
  int64_t turns_run = 0;
  while (!ready.empty() || !queue.empty()) {
    // Admit every turn ready by now; if none is queued, jump to the next one.
    if (queue.empty() && ready.top().first > now) now = ready.top().first;
    bool admitted = false;
    while (!ready.empty() && ready.top().first <= now) {
      queue.push_back(ready.top().second);
      ready.pop();
      admitted = true;
    }
    if (admitted) publish_queue();
    const int s = queue.front();
    queue.pop_front();
    Session& session = sessions[s];
    const Turn& turn = (*session.conversation)[session.next_turn];

    // The prompt: history cut to the window (the engine's rule: whole blocks after the first one,
    // oldest first; a session never drops less than its stored KV did), then the new message.
    const int64_t room = std::max<int64_t>(0, o.window - turn.user_tokens - turn.reply_tokens);
    int64_t drop = std::max<int64_t>(0, session.history_tokens - room);
    drop = (drop + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
    if (drop > 0) drop = std::max(drop, session.stored_drop);
    drop = std::min(drop, std::max<int64_t>(0, session.history_tokens - kBlockTokens) /
                              kBlockTokens * kBlockTokens);
    const int64_t history = session.history_tokens - drop;

    // Load: the stored item, found by session; of its chunks, block 0 and those the new drop
    // keeps (the store re-rotates them).
    int64_t loaded = 0;
    if (session.next_turn > 0) {
      // The conversation up to the end of what was saved, and one token left to compute.
      const std::vector<TokenId> saved = tokens(s, 0, session.stored_end + 1);
      std::optional<store::StoreMatch> match = kv_store.find(saved, root, std::to_string(s));
      bool dram = false;
      if (match) {
        // As the engine: chunk 0, and the chunks past what this turn drops beyond the item.
        const int64_t shift = (drop - (match->exact ? 0 : match->token_offset)) / kBlockTokens;
        const int64_t rest = std::max<int64_t>(0, match->num_chunks - 1 - shift);
        auto head = kv_store.acquire(match->item, 0, 1);
        auto tail = head.ok() && rest > 0
                        ? kv_store.acquire(match->item, 1 + shift, rest)
                        : StatusOr<store::StoreLease>(store::StoreLease{});
        if (head.ok() && tail.ok()) {
          dram = head->served_from == store::kDramTier && tail->served_from == store::kDramTier;
          loaded = std::min((1 + rest) * kBlockTokens, history);
        } else {
          match.reset();
        }
        if (head.ok()) kv_store.release(*head, 0);
        if (head.ok() && rest > 0 && tail.ok()) kv_store.release(*tail, 0);
      }
      if (turns_run >= o.warmup_turns) {
        ++r.counted_turns;
        r.counted_history_tokens += history;
        r.hit_tokens += loaded;
        if (match) {
          ++r.hits;
          if (dram) ++r.dram_hits;
        }
      }
    }
    const double service =
        static_cast<double>(history - loaded + turn.user_tokens) / o.prefill_tokens_per_s +
        static_cast<double>(turn.reply_tokens) / o.decode_tokens_per_s;
    queue_area += service * static_cast<double>(queue.size());
    now += service;
    r.gpu_hours += service / 3600;
    ++turns_run;

    // Save what the turn saw plus its reply (full blocks), under the session.
    const int64_t end = session.history_tokens + turn.user_tokens + turn.reply_tokens;
    const int64_t full_blocks = (end - drop) / kBlockTokens;
    std::vector<TokenId> kept = tokens(s, 0, std::min<int64_t>(kBlockTokens, end));
    if (full_blocks > 1) {
      const std::vector<TokenId> rest =
          tokens(s, kBlockTokens + drop, full_blocks * kBlockTokens + drop);
      kept.insert(kept.end(), rest.begin(), rest.end());
    }
    store::SaveRequest save;
    save.session = std::to_string(s);
    save.exact = drop == 0;
    save.token_offset = drop;
    kv::ChunkHash hash = root;
    for (int64_t b = 0; b < full_blocks; ++b) {
      hash = kv::chain_hash(hash, std::span<const TokenId>(kept).subspan(b * kBlockTokens,
                                                                        kBlockTokens));
      save.chain.push_back(hash);
    }
    if (!save.chain.empty()) {
      auto ticket = kv_store.begin_save(save);
      if (ticket.ok()) {
        session.item = ticket->item;
        if (!ticket->destinations.empty()) kv_store.commit_save(*std::move(ticket), nullptr, 0);
        session.stored_drop = drop;
        session.stored_end = full_blocks * kBlockTokens + (full_blocks > 1 ? drop : 0);
      }
    }
    session.history_tokens = end;
    if (++session.next_turn < session.conversation->size()) {
      ready.push({now + think(rng), s});
    }
    publish_queue();
  }
  r.simulated_hours = now / 3600;
  r.mean_queue_length = now > 0 ? queue_area / now : 0;
  r.stats = kv_store.stats();
  return r;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // stdout carries the JSON result
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--sharegpt") {
      o.sharegpt = value;
    } else if (flag == "--dir") {
      o.dir = value;
    } else if (flag == "--sessions") {
      o.sessions = std::stoi(value);
    } else if (flag == "--warmup-turns") {
      o.warmup_turns = std::stoll(value);
    } else if (flag == "--dram-gb") {
      o.dram_gb = std::stod(value);
    } else if (flag == "--ssd-tb") {
      o.ssd_tb.clear();
      for (const std::string& v : split(value)) o.ssd_tb.push_back(std::stod(v));
    } else if (flag == "--policies") {
      o.policies = split(value);
    } else if (flag == "--kv-bytes-per-token") {
      o.kv_bytes_per_token = std::stoll(value);
    } else if (flag == "--window") {
      o.window = std::stoll(value);
    } else if (flag == "--rate") {
      o.rate = std::stod(value);
    } else if (flag == "--think-seconds") {
      o.think_seconds = std::stod(value);
    } else if (flag == "--prefill-tokens-per-s") {
      o.prefill_tokens_per_s = std::stod(value);
    } else if (flag == "--decode-tokens-per-s") {
      o.decode_tokens_per_s = std::stod(value);
    } else if (flag == "--seed") {
      o.seed = std::stoull(value);
    } else {
      std::cerr << "unknown flag " << flag << " (see the header of bench/store_policy_bench.cpp)\n";
      return 2;
    }
  }
  if (o.sharegpt.empty()) {
    std::cerr << "--sharegpt FILE is required (../shared/data/sharegpt/*.json.xz)\n";
    return 2;
  }
  const std::vector<Conversation> conversations = load_sharegpt(o.sharegpt);
  Json out = {{"bench", "store_policy"},
              {"sessions", o.sessions},
              {"conversations", conversations.size()},
              {"warmup_turns", o.warmup_turns},
              {"dram_gb", o.dram_gb},
              {"kv_bytes_per_token", o.kv_bytes_per_token},
              {"window", o.window},
              {"rate_per_s", o.rate},
              {"think_seconds", o.think_seconds},
              {"prefill_tokens_per_s", o.prefill_tokens_per_s},
              {"decode_tokens_per_s", o.decode_tokens_per_s},
              {"seed", o.seed},
              {"runs", Json::array()}};
  for (double ssd_tb : o.ssd_tb) {
    for (const std::string& name : o.policies) {
      auto policy = store::parse_eviction_policy(name);
      if (!policy.ok()) {
        std::cerr << policy.status().to_string() << "\n";
        return 2;
      }
      const auto start = std::chrono::steady_clock::now();
      const Result r = simulate(o, conversations, *policy, ssd_tb);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double turns = static_cast<double>(std::max<int64_t>(1, r.counted_turns));
      Json run = {{"ssd_tb", ssd_tb},
                  {"policy", name},
                  {"counted_turns", r.counted_turns},
                  {"hit_rate", r.hits / turns},
                  {"dram_hit_rate", r.dram_hits / turns},
                  {"dram_share_of_hits", r.hits ? static_cast<double>(r.dram_hits) / r.hits : 0.0},
                  {"history_token_hit_rate",
                   r.counted_history_tokens
                       ? static_cast<double>(r.hit_tokens) / r.counted_history_tokens
                       : 0.0},
                  {"prefetches", r.stats.prefetches},
                  {"saves_skipped", r.stats.saves_skipped},
                  {"saves_partial", r.stats.saves_partial},
                  {"dram_evictions", r.stats.tier("dram").evictions},
                  {"ssd_evictions", r.stats.tier("ssd").evictions},
                  {"mean_queue_length", r.mean_queue_length},
                  {"simulated_hours", r.simulated_hours},
                  {"gpu_hours", r.gpu_hours},
                  {"wall_seconds", wall}};
      std::cerr << run.dump() << "\n";
      out["runs"].push_back(std::move(run));
    }
  }
  std::filesystem::remove_all(o.dir);
  std::cout << out.dump(2) << "\n";
  return 0;
}
