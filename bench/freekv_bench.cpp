// FreeKV's decode step on the CPU (src/executor/freekv_layer.h) against full attention,
// synchronous retrieval (tau above 1: selection and recall before every attention) and
// StreamingLLM (sink + window only), at growing contexts, over 8 layers that share one recall
// worker as a model's do (a layer's selection and recall for the next step overlap the following
// layers' attention; with one layer there is nothing to overlap), reported per layer. All four
// attend through the same libtorch op (kernels/freekv_ops.h), so the figures compare what each
// reads, not two implementations. Shapes: Qwen2.5-Coder-1.5B attention (12 query heads, 2 KV heads,
// head_dim 128), float32 (the CPU's compute dtype), the paper's budget (B = 2048, S = W = 512, p =
// 32). Keys, values and queries are random; each query is the previous one plus noise of `drift`
// times its scale (adjacent-query cosine about 0.9, as the paper measures on real models), so the
// correction rate here says nothing about a real model's.
//
// usage: freekv_bench [--json PATH] [--steps N] [--threads N]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "freekv_layer.h"
#include "strata/kernels/freekv_ops.h"

namespace {

using strata::executor::FreeKvConfig;
using strata::executor::FreeKvLayer;
using strata::executor::RecallWorker;
namespace ka = strata::kernels::aten;

constexpr int64_t kHeads = 12, kKvHeads = 2, kDim = 128, kLayers = 8;
constexpr double kDrift = 0.45;

struct Trace {
  at::Tensor k, v;  // [context + steps, n_kv, d]
  std::vector<at::Tensor> q;
};

Trace make_trace(int64_t context, int64_t steps) {
  at::manual_seed(7);
  Trace t;
  t.k = at::randn({context + steps, kKvHeads, kDim});
  t.v = at::randn({context + steps, kKvHeads, kDim});
  at::Tensor q = at::randn({kHeads, kDim});
  for (int64_t i = 0; i < steps; ++i) {
    q = q + kDrift * at::randn_like(q);
    q = q / q.norm(2, 1, true) * std::sqrt(static_cast<double>(kDim));
    t.q.push_back(q.clone());
  }
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Row {
  std::string method;
  int64_t context = 0;
  double ms_per_step = 0;
  double corrected_share = 0, recalled_pages_per_step = 0, reused_pages_per_step = 0;
  double recall_hidden_share = 0, recalled_mib_per_step = 0;
};

// FreeKV at tau (2 = synchronous retrieval) over kLayers layers (the same keys in each).
Row run_freekv(const Trace& t, int64_t context, int64_t steps, double tau, const char* name) {
  const FreeKvConfig o{.page_tokens = 32,
                       .budget_tokens = 2048,
                       .sink_tokens = 512,
                       .window_tokens = 512,
                       .tau = tau};
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  RecallWorker worker;  // outlives the layers
  std::vector<std::unique_ptr<FreeKvLayer>> layers;
  for (int64_t l = 0; l < kLayers; ++l) {
    layers.push_back(std::make_unique<FreeKvLayer>(o, kKvHeads, kDim, at::kFloat, worker));
    layers.back()->prefill(t.k.narrow(0, 0, context), t.v.narrow(0, 0, context));
  }
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    for (auto& layer : layers) {
      at::Tensor out = layer->decode(t.q[i], t.k[context + i], t.v[context + i], scale);
    }
  }
  const double ms = seconds_since(start) * 1e3 / (steps * kLayers);
  strata::executor::FreeKvCounts s;  // over the layers; the last recalls may be in flight
  for (const auto& layer : layers) strata::executor::add_counts(s, layer->stats());
  Row r{name, context, ms};
  const double layer_steps = static_cast<double>(steps * kLayers);
  r.corrected_share = static_cast<double>(s.corrected_heads) / s.head_steps;
  r.recalled_pages_per_step = static_cast<double>(s.recalled_pages) / layer_steps;
  r.reused_pages_per_step = static_cast<double>(s.reused_pages) / layer_steps;
  r.recall_hidden_share = 1.0 - s.recall_exposed_seconds / s.recall_seconds;
  // A (page, head) copy from the host moves 2 x p x d float32 elements.
  r.recalled_mib_per_step = r.recalled_pages_per_step * 2 * 32 * kDim * 4 / (1 << 20);
  return r;
}

// Full attention, or StreamingLLM's sink + window, through the same op (no cache pages).
Row run_dense(const Trace& t, int64_t context, int64_t steps, bool streaming) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  const at::Tensor empty = at::empty({0, 32, kKvHeads, kDim});
  const at::Tensor slots = at::zeros({kKvHeads}, at::kLong);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t n = context + i + 1;
    at::Tensor k = t.k.narrow(0, 0, n), v = t.v.narrow(0, 0, n);
    if (streaming) {
      k = at::cat({k.narrow(0, 0, 512), k.narrow(0, n - 512, 512)});
      v = at::cat({v.narrow(0, 0, 512), v.narrow(0, n - 512, 512)});
    }
    for (int64_t l = 0; l < kLayers; ++l) {
      at::Tensor out = ka::freekv_attention(t.q[i], k, v, empty, empty, slots, scale);
    }
  }
  return Row{streaming ? "streamingllm" : "full", context,
             seconds_since(start) * 1e3 / (steps * kLayers)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int64_t steps = 64, threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::stoll(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: freekv_bench [--json PATH] [--steps N] [--threads N]\n");
      return 2;
    }
  }
  at::set_num_threads(static_cast<int>(threads));
  std::vector<Row> rows;
  for (int64_t context : {4096, 16384, 32768}) {
    const Trace t = make_trace(context, steps);
    rows.push_back(run_dense(t, context, steps, /*streaming=*/false));
    rows.push_back(run_freekv(t, context, steps, 2.0, "synchronous"));
    rows.push_back(run_freekv(t, context, steps, 0.8, "freekv"));
    rows.push_back(run_dense(t, context, steps, /*streaming=*/true));
  }
  std::printf("%-13s %8s %12s %10s %10s %12s %12s %12s %8s\n", "method", "context", "ms/step",
              "vs full", "corrected", "recalled/st", "reused/st", "MiB/step", "hidden");
  nlohmann::json out = nlohmann::json::array();
  double full_ms = 0;
  for (const Row& r : rows) {
    if (r.method == "full") full_ms = r.ms_per_step;
    std::printf("%-13s %8lld %12.3f %9.2fx %10.3f %12.1f %12.1f %12.2f %8.3f\n", r.method.c_str(),
                static_cast<long long>(r.context), r.ms_per_step, full_ms / r.ms_per_step,
                r.corrected_share, r.recalled_pages_per_step, r.reused_pages_per_step,
                r.recalled_mib_per_step, r.recall_hidden_share);
    out.push_back({{"method", r.method},
                   {"context", r.context},
                   {"ms_per_step", r.ms_per_step},
                   {"speedup_vs_full", full_ms / r.ms_per_step},
                   {"corrected_share", r.corrected_share},
                   {"recalled_pages_per_step", r.recalled_pages_per_step},
                   {"reused_pages_per_step", r.reused_pages_per_step},
                   {"recalled_mib_per_step", r.recalled_mib_per_step},
                   {"recall_hidden_share", r.recall_hidden_share}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
