// LeanKV's two CPU-measurable system figures (docs/leankv.md, "Measured"):
//   1. bytes of KV one decode step reads per format, exact from the page formats' own layout code
//      (kv/leankv_page_format.h for LeanKV's tiers, kv/kv_format.h for the uniform formats): the
//      bound a memory-bound GPU kernel is held to. Per token of context, per layer and KV head,
//      and per decode step of a whole model at a context length.
//   2. the page manager's time per step (kv/leankv_pages.h, the sequential implementation the CPU
//      serves with), for the paper's setting (32 layers x 8 KV heads, batch 32..128): a decode
//      step's allocation (a page for a random tenth of the sections that filled) and the prompt
//      phase's conservative allocation + split, best of 20 runs.
//
//   build/bench/leankv_bench [--head-dim 64] [--layers 30] [--kv-heads 3] [--context
//   1024,4096,32768]
// Prints one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "strata/kv/kv_format.h"
#include "strata/kv/leankv_page_format.h"
#include "strata/kv/leankv_pages.h"

namespace {

namespace kv = strata::kv;
namespace leankv = strata::kv::leankv;
using Json = nlohmann::json;

struct Args {
  int64_t head_dim = 64, layers = 30, kv_heads = 3;
  std::vector<int64_t> contexts = {1024, 4096, 32768};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--head-dim") a.head_dim = std::stoll(value);
    if (flag == "--layers") a.layers = std::stoll(value);
    if (flag == "--kv-heads") a.kv_heads = std::stoll(value);
    if (flag == "--context") {
      a.contexts.clear();
      std::stringstream in(value);
      for (std::string item; std::getline(in, item, ',');) a.contexts.push_back(std::stoll(item));
    }
  }
  return a;
}

// Bytes one token's K and V take in a uniform format (data, scales, zeros; per block of 16
// tokens, one KV head, so per-channel scales are shared over the block as the pool stores them).
double uniform_token_bytes(const std::string& name, int64_t head_dim) {
  const kv::KvFormat f = kv::parse_format(name).value();
  return static_cast<double>(kv::block_bytes(f, 1, 16, head_dim)) / 16.0;
}

// Bytes of K and V (data + scale/zero) one LeanKV token of a precision takes; the accumulator
// and position (8 bytes) are counted separately: the kernel reads and writes the accumulator.
double lean_kv_bytes(const leankv::PageFormat& f, leankv::Precision p) {
  return static_cast<double>(f.token_bytes(p) - 8);
}

// Best of 20 runs of `run` (timed) each after `prepare` (not timed), in microseconds.
template <typename Prepare, typename Run>
double best_microseconds(Prepare&& prepare, Run&& run) {
  double best = 1e30;
  for (int i = 0; i < 20; ++i) {
    prepare();
    const auto start = std::chrono::steady_clock::now();
    run();
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

struct Manager {
  Manager(int64_t pages, int64_t entries, int64_t width)
      : ring(pages),
        counters(leankv::kNumCounters),
        tables(entries * width),
        counts(entries * 2),
        state{ring.data(), counters.data(), tables.data(), counts.data(), pages, entries, width} {
    leankv::init_pages(state);
  }
  std::vector<int32_t> ring;
  std::vector<int64_t> counters;
  std::vector<int32_t> tables, counts;
  leankv::PageManagerState state;
};

Json manager_times(int64_t batch, int64_t layers, int64_t kv_heads, int64_t prompt) {
  const int64_t entries = batch * layers * kv_heads;
  const int64_t high_pages = (prompt + 31) / 32;  // conservative prompt allocation, 32 per page
  const int64_t width = high_pages + 2 + 16;
  std::vector<int32_t> ids(entries);
  for (int64_t e = 0; e < entries; ++e) ids[e] = static_cast<int32_t>(e);
  Json out = {{"batch", batch}, {"entries", entries}, {"prompt_tokens", prompt}};
  // Prompt phase: allocate every entry's conservative pages, keep ~40% high, ~15% low.
  std::unique_ptr<Manager> m;
  std::vector<int32_t> conservative(2 * entries, 0), keep(2 * entries, 0);
  for (int64_t e = 0; e < entries; ++e) {
    conservative[2 * e] = static_cast<int32_t>(high_pages);
    keep[2 * e] = static_cast<int32_t>(high_pages * 4 / 10);
    keep[2 * e + 1] = static_cast<int32_t>(high_pages * 3 / 20);
  }
  out["prompt_alloc_split_us"] = best_microseconds(
      [&] { m = std::make_unique<Manager>(entries * (high_pages + 4), entries, width); },
      [&] {
        leankv::allocate_pages(m->state, {ids.data(), conservative.data(), entries});
        leankv::split_pages(m->state, {ids.data(), keep.data(), entries});
      });
  // Decode step: a random tenth of the sections need a page (after the prompt's pages).
  std::mt19937 rng(1);
  std::vector<int32_t> needs;
  for (int64_t e = 0; e < entries; ++e) {
    needs.push_back(rng() % 10 == 0);
    needs.push_back(rng() % 10 == 0);
  }
  out["decode_alloc_us"] = best_microseconds(
      [&] {
        m = std::make_unique<Manager>(entries * (high_pages + 4), entries, width);
        leankv::allocate_pages(m->state, {ids.data(), conservative.data(), entries});
        leankv::split_pages(m->state, {ids.data(), keep.data(), entries});
      },
      [&] {
        leankv::allocate_pages(m->state, {ids.data(), needs.data(), entries});
      });
  const bool all_fit = m->counters[leankv::kShortfall] == 0;
  out["decode_alloc_fit"] = all_fit;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const leankv::PageFormat lean =
      leankv::PageFormat::create(a.head_dim, {8, 4}, {4, 2}, 32).value();
  const double bf16 = uniform_token_bytes("bfloat16", a.head_dim);
  Json formats = Json::array();
  auto add = [&](const std::string& name, double bytes) {
    Json row = {{"format", name}, {"bytes_per_token_head", bytes}, {"ratio_to_bf16", bf16 / bytes}};
    Json per_step = Json::object();
    for (int64_t n : a.contexts) {
      per_step[std::to_string(n)] = bytes * static_cast<double>(n * a.layers * a.kv_heads);
    }
    row["bytes_per_decode_step"] = per_step;
    formats.push_back(row);
  };
  add("bfloat16", bf16);
  add("k8v8 (int8/token)", uniform_token_bytes("k:int8/token" + std::to_string(a.head_dim) +
                                                   ",v:int8/token" + std::to_string(a.head_dim),
                                               a.head_dim));
  add("fp8 (e4m3/token)",
      uniform_token_bytes("fp8/token" + std::to_string(a.head_dim), a.head_dim));
  add("kivi-2 (int2 K/channel, V/token32)",
      uniform_token_bytes("k:int2/channel,v:int2/token32", a.head_dim));
  add("leankv high (K8V4)", lean_kv_bytes(lean, leankv::Precision::kHigh));
  add("leankv low (K4V2)", lean_kv_bytes(lean, leankv::Precision::kLow));
  Json out = {{"head_dim", a.head_dim},
              {"layers", a.layers},
              {"kv_heads", a.kv_heads},
              {"leankv_page_bytes", lean.page_bytes()},
              {"leankv_tokens_per_page",
               {{"high", lean.tokens_per_page(leankv::Precision::kHigh)},
                {"low", lean.tokens_per_page(leankv::Precision::kLow)}}},
              {"leankv_accumulator_bytes_per_token", 8},
              {"formats", formats}};
  Json manager = Json::array();
  for (int64_t batch : {32, 64, 128}) manager.push_back(manager_times(batch, 32, 8, 1024));
  out["page_manager"] = manager;
  std::cout << out.dump(2) << "\n";
  return 0;
}
