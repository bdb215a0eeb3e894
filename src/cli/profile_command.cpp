// `strata profile`: measures on this machine what AdaptCache's placement weighs
// (docs/adaptcache.md) and writes the profile file kv_store.adaptcache_profile reads: the model's
// prefill time per token, each storage tier's read bandwidth and latency, and each lossy codec's
// decode time per raw byte; the codecs' quality comes from a quality profile (written by
// bench/adaptcache_report.py --profile-out, which measures it on the model's answers).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "commands.h"
#include "loaded_model.h"
#include "strata/common/clock.h"
#include "strata/common/hex.h"
#include "strata/kv/kv_format.h"
#include "strata/store/env.h"
#include "strata/store/kv_store.h"
#include "strata/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

constexpr const char* kUsage =
    R"(usage: strata profile --model PATH --output FILE [--qualities FILE] [options]

Measures on this machine what AdaptCache's placement weighs (docs/adaptcache.md) and writes the
profile that kv_store.adaptcache_profile reads:
  prefill_seconds_per_token   the model's prefill of a --prefill-tokens prompt (the faster of two)
  tiers: dram                 memcpy bandwidth over --copy-mib MiB (the best of three)
  tiers: each SSD tier        read bandwidth of the tier's reads (one stored chunk each, O_DIRECT
                              as the tier opens its files, at kv_store.ssd_bandwidth_limit when
                              set) over a --ssd-mib MiB file written in its directory, and the
                              median latency of a 4 KiB read
  codecs: kivi-8/4/2          decode time per raw byte of the model's KV chunks (the best of three)
  codecs: streaming-*         nothing to measure (kept chunks load raw): listed when --qualities
                              has them
The codecs' quality is copied from --qualities (a profile written by bench/adaptcache_report.py
--profile-out); without it the file has none and a server refuses it until one is added.
AdaptCache chooses among the codecs the profile lists.

  --model PATH            GGUF file or HF model directory
  --output FILE           the profile to write (JSON)
  --qualities FILE        a profile whose codecs carry a "quality" (and a "task_quality" per
                          task family: build/bench/codec_quality_bench writes them)
  --prefill-tokens N      prompt length of the prefill measurement (default 1024)
  --copy-mib N            DRAM copy size (default 256)
  --ssd-mib N             file size of each SSD tier's measurement (default 256)
  --config FILE, --set section.key=value, --device, --dtype, --threads   the deployment
                          measured (kv_store.ssd_dir names the SSD tier's directory)
)";

using Clock = SteadyClock;

// Bytes per second of one memcpy of `bytes`, the best of three.
double dram_bandwidth(int64_t bytes) {
  std::vector<std::byte> from(static_cast<size_t>(bytes), std::byte{1}), to(from.size());
  double best = INFINITY;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    std::memcpy(to.data(), from.data(), from.size());
    best = std::min(best, seconds_since(start));
  }
  return static_cast<double>(bytes) / best;
}

struct AlignedBuffer {
  explicit AlignedBuffer(int64_t bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(4096, static_cast<size_t>(bytes)))),
        size(bytes) {
    if (data == nullptr) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::span<std::byte> span() const { return {data, static_cast<size_t>(size)}; }
  std::byte* data;
  int64_t size;
};

struct TierRate {
  double bandwidth = 0, latency_seconds = 0;
  bool direct_io = false;
};

// An SSD tier's reads: a file of `file_bytes` written in its directory, read back in `read_bytes`
// units (whole 4 KiB pages), sequentially; then 64 single pages at scattered offsets for the
// latency, through the tier's bandwidth limit when it has one. The file is removed.
StatusOr<TierRate> ssd_rate(const store::SsdOptions& tier, int64_t file_bytes, int64_t read_bytes) {
  std::unique_ptr<store::Env> throttled;
  store::Env* env = tier.env;
  if (tier.bandwidth_limit > 0) {
    throttled = store::throttled_env(tier.env, tier.bandwidth_limit);
    env = throttled.get();
  }
  STRATA_RETURN_IF_ERROR(env->create_dir(tier.dir));
  const std::string path = tier.dir + "/profile-" + std::to_string(::getpid()) + ".tmp";
  // The measurement file goes whatever happens to the measurement.
  struct Remove {
    store::Env* env;
    const std::string& path;
    ~Remove() { (void)env->remove(path); }
  } remove{env, path};
  TierRate rate;
  {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<store::File> file,
                            env->open(path, store::OpenMode::kReadWrite, tier.direct_io));
    rate.direct_io = file->direct_io();
    const int64_t unit = (read_bytes + 4095) / 4096 * 4096;
    const int64_t units = std::max<int64_t>(1, file_bytes / unit);
    AlignedBuffer buffer(unit);
    std::memset(buffer.data, 0x5A, static_cast<size_t>(unit));
    for (int64_t i = 0; i < units; ++i) {
      STRATA_RETURN_IF_ERROR(file->write_at(i * unit, buffer.span()));
    }
    STRATA_RETURN_IF_ERROR(file->sync());
    auto start = Clock::now();
    for (int64_t i = 0; i < units; ++i) {
      STRATA_RETURN_IF_ERROR(file->read_at(i * unit, buffer.span()));
    }
    rate.bandwidth = static_cast<double>(units * unit) / seconds_since(start);
    AlignedBuffer page(4096);
    std::vector<double> latencies;
    const int64_t pages = units * unit / 4096;
    for (int64_t i = 0; i < 64; ++i) {
      start = Clock::now();
      STRATA_RETURN_IF_ERROR(file->read_at((i * 7919 % pages) * 4096, page.span()));
      latencies.push_back(seconds_since(start));
    }
    std::nth_element(latencies.begin(), latencies.begin() + 32, latencies.end());
    rate.latency_seconds = latencies[32];
  }
  return rate;
}

// Seconds per prompt token of a prefill of `tokens` tokens of English text (the faster of two
// runs; the prefix cache is off, so both compute every token).
StatusOr<double> prefill_seconds_per_token(engine::Engine& engine, int64_t tokens) {
  const tokenizer::Tokenizer& tok = engine.tokenizer();
  const std::vector<TokenId> sentence = tok.encode(
      " The store keeps the history of each conversation so that the next turn can load it.",
      false);
  if (sentence.empty()) return internal_error("the tokenizer encodes English text to nothing");
  std::vector<TokenId> prompt;
  while (std::ssize(prompt) < tokens) prompt.insert(prompt.end(), sentence.begin(), sentence.end());
  prompt.resize(static_cast<size_t>(tokens));
  double seconds = INFINITY;
  for (int run = 0; run < 2; ++run) {
    engine::GenerateRequest request;
    request.prompt_token_ids = prompt;
    request.sampling.temperature = 0;
    request.sampling.max_tokens = 1;
    request.sampling.ignore_eos = true;
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<engine::RequestStream> stream,
                            engine.submit(std::move(request)));
    engine::RequestOutput last;
    while (std::optional<engine::RequestOutput> out = stream->next()) last = std::move(*out);
    if (last.finish_reason == engine::FinishReason::kError) {
      return internal_error("the prefill measurement failed: " + last.error);
    }
    seconds = std::min(seconds, last.usage.time_to_first_token_ms / 1e3);
  }
  return seconds / static_cast<double>(tokens);
}

// Float values (about N(0, 1), deterministic) in the pool's element type.
void fill_chunk(std::span<std::byte> chunk, DType dtype, uint32_t seed) {
  uint32_t state = seed * 2654435761u + 1;
  auto next = [&] {  // the sum of four uniforms, centred: a bell curve
    float sum = 0;
    for (int i = 0; i < 4; ++i) {
      state = state * 1664525u + 1013904223u;
      sum += static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
    }
    return (sum - 2.0f) * 1.7f;
  };
  if (dtype == DType::kFloat32) {
    for (size_t i = 0; i + 4 <= chunk.size(); i += 4) {
      const float v = next();
      std::memcpy(chunk.data() + i, &v, 4);
    }
    return;
  }
  for (size_t i = 0; i + 2 <= chunk.size(); i += 2) {
    const float v = next();
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    uint16_t half;
    if (dtype == DType::kBFloat16) {
      half = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    } else {  // float16: |v| < 8, small values flushed to zero
      const uint32_t sign = (bits >> 16) & 0x8000u;
      const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
      half = exponent <= 0 ? static_cast<uint16_t>(sign)
                           : static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) |
                                                   ((bits >> 13) & 0x3FFu));
    }
    std::memcpy(chunk.data() + i, &half, 2);
  }
}

// Chunks in[i] -> out[i] through one of the store's codecs.
using Convert =
    std::function<Status(std::span<const std::byte* const> in, std::span<std::byte* const> out)>;

// Seconds per raw byte of decoding chunks of a codec (`encoded` bytes each) back to the pool's
// layout (the best of three over 16 chunks) on the host, with libtorch: what a CPU deployment's
// loads spend. (A CUDA deployment decodes KIVI loads with the unpack kernel on the device, which
// this does not measure.)
StatusOr<double> decode_seconds_per_byte(const executor::Executor& executor, int64_t encoded,
                                         const Convert& encode, const Convert& decode) {
  constexpr int kChunks = 16;
  const int64_t raw = executor.kv_chunk_bytes();
  std::vector<std::vector<std::byte>> raws(kChunks, std::vector<std::byte>(raw));
  std::vector<std::vector<std::byte>> codes(kChunks, std::vector<std::byte>(encoded));
  std::vector<const std::byte*> raw_in;
  std::vector<std::byte*> raw_out, code_out;
  std::vector<const std::byte*> code_in;
  for (int i = 0; i < kChunks; ++i) {
    fill_chunk(raws[i], executor.dtype(), static_cast<uint32_t>(i));
    raw_in.push_back(raws[i].data());
    raw_out.push_back(raws[i].data());
    code_out.push_back(codes[i].data());
    code_in.push_back(codes[i].data());
  }
  STRATA_RETURN_IF_ERROR(encode(raw_in, code_out));
  double best = INFINITY;
  for (int run = 0; run < 3; ++run) {
    const auto start = Clock::now();
    STRATA_RETURN_IF_ERROR(decode(code_in, raw_out));
    best = std::min(best, seconds_since(start));
  }
  return best / static_cast<double>(kChunks * raw);
}

// The "quality" (and "task_quality", per task family, where given) of each codec of a quality
// profile, by name.
StatusOr<nlohmann::json> read_qualities(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found_error("--qualities: cannot read " + path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("codecs") || !j["codecs"].is_array()) {
    return invalid_argument_error("--qualities " + path + ": expected an object with codecs");
  }
  nlohmann::json qualities = nlohmann::json::object();
  for (const nlohmann::json& c : j["codecs"]) {
    if (c.is_object() && c.contains("name") && c["name"].is_string() && c.contains("quality") &&
        c["quality"].is_number()) {
      nlohmann::json& q = qualities[c["name"].get<std::string>()];
      q["quality"] = c["quality"];
      if (c.contains("task_quality")) q["task_quality"] = c["task_quality"];
    }
  }
  return qualities;
}

Status profile(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = {"output", "qualities", "prefill-tokens", "copy-mib",
                                       "ssd-mib"};
  value_flags.insert(deployment_flag_names().begin(), deployment_flag_names().end());
  STRATA_ASSIGN_OR_RETURN(
      Flags flags, Flags::parse(args, value_flags, {"help"}, deployment_repeated_flag_names()));
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return Status();
  }
  if (!flags.has("output")) return invalid_argument_error("--output FILE is required");
  STRATA_ASSIGN_OR_RETURN(int64_t prefill_tokens, flags.get_int("prefill-tokens", 1024));
  STRATA_ASSIGN_OR_RETURN(int64_t copy_mib, flags.get_int("copy-mib", 256));
  STRATA_ASSIGN_OR_RETURN(int64_t ssd_mib, flags.get_int("ssd-mib", 256));
  if (prefill_tokens < 16 || copy_mib < 1 || ssd_mib < 1) {
    return invalid_argument_error("--prefill-tokens must be >= 16, --copy-mib and --ssd-mib >= 1");
  }
  nlohmann::json qualities = nlohmann::json::object();
  if (flags.has("qualities")) {
    STRATA_ASSIGN_OR_RETURN(qualities, read_qualities(flags.get("qualities", "")));
  }
  STRATA_ASSIGN_OR_RETURN(config::DeploymentConfig deployment, deployment_from_flags(flags));
  // The tiers are measured directly: the engine runs without the store (and so without a
  // profile), and without the prefix cache, so each prefill computes every token.
  const store::StoreOptions tiers = store::StoreOptions::from_config(deployment.kv_store);
  deployment.kv_store.dram_bytes = 0;
  deployment.kv_store.adaptcache = {};
  deployment.kv_cache.enable_prefix_caching = false;
  STRATA_ASSIGN_OR_RETURN(LoadedEngine loaded, load_engine(deployment));
  engine::Engine& engine = *loaded.engine;
  const executor::Executor& executor = engine.executor();
  if (prefill_tokens > engine.model_config().max_context_tokens - 1) {
    return invalid_argument_error("--prefill-tokens must be below the model's context (" +
                                  std::to_string(engine.model_config().max_context_tokens) + ")");
  }

  nlohmann::json out;
  std::string command = "strata profile";
  for (const std::string& a : args) command += " " + a;
  out["source"] = command;
  // A deployment serving other weights refuses the file (restore/item_codecs.cpp).
  out["model_fingerprint"] = hex64(engine.model_fingerprint());
  out["device"] = executor::device_name(executor.device());
  out["dtype"] = dtype_name(executor.dtype());
  STRATA_ASSIGN_OR_RETURN(double prefill, prefill_seconds_per_token(engine, prefill_tokens));
  out["prefill_seconds_per_token"] = prefill;
  std::fprintf(stderr, "prefill: %.3g s per token\n", prefill);

  const double dram = dram_bandwidth(copy_mib << 20);
  std::fprintf(stderr, "dram: %.3g GB/s\n", dram / 1e9);
  out["tiers"] =
      nlohmann::json::array({{{"name", "dram"}, {"bandwidth", dram}, {"latency_seconds", 0.0}}});
  for (const store::SsdOptions& tier : tiers.tiers) {
    STRATA_ASSIGN_OR_RETURN(TierRate rate,
                            ssd_rate(tier, ssd_mib << 20, executor.kv_chunk_bytes()));
    std::fprintf(stderr, "%s (%s): %.3g GB/s, %.3g ms per 4 KiB read%s\n", tier.name.c_str(),
                 tier.dir.c_str(), rate.bandwidth / 1e9, rate.latency_seconds * 1e3,
                 rate.direct_io ? "" : " (buffered: the file system refuses O_DIRECT)");
    out["tiers"].push_back({{"name", tier.name},
                            {"bandwidth", rate.bandwidth},
                            {"latency_seconds", rate.latency_seconds},
                            {"direct_io", rate.direct_io}});
  }

  out["codecs"] = nlohmann::json::array();
  for (int bits : {8, 4, 2}) {
    const std::string name = "kivi-" + std::to_string(bits);
    const kv::KvFormat format = kv::kivi_format(bits);
    STRATA_ASSIGN_OR_RETURN(
        double decode, decode_seconds_per_byte(
                           executor, executor.kv_chunk_bytes(format),
                           [&](auto in, auto out) {
                             return executor.transcode_kv_chunks(std::nullopt, format, in, out);
                           },
                           [&](auto in, auto out) {
                             return executor.transcode_kv_chunks(format, std::nullopt, in, out);
                           }));
    nlohmann::json codec = {{"name", name}, {"decode_seconds_per_byte", decode}};
    if (qualities.contains(name)) codec.update(qualities[name]);
    std::fprintf(stderr, "%s: decode %.3g ns per raw byte\n", name.c_str(), decode * 1e9);
    out["codecs"].push_back(codec);
  }
  // Krul's layer merge (with the deployment's layer_share and merge_retain, and MiniCache's
  // pairs: the decode cost does not depend on which layers pair), when its quality is given.
  if (qualities.contains("layer-merge")) {
    const kv::KvGeometry& g = executor.kv_geometry();
    const kv::krul::MergedForm form =
        kv::krul::merged_form(deployment.kv_store.layer_share, deployment.kv_store.merge_retain,
                              g.num_layers, int64_t{g.num_kv_heads} * g.block_size_tokens);
    const std::vector<kv::krul::LayerPair> pairs =
        kv::krul::adjacent_pairs(g.num_layers - 2 * form.pairs, g.num_layers - 1);
    STRATA_ASSIGN_OR_RETURN(
        double decode,
        decode_seconds_per_byte(
            executor, executor.kv_chunk_bytes(form),
            [&](auto in, auto out) { return executor.merge_kv_chunks(form, pairs, in, out); },
            [&](auto in, auto out) {
              return executor.unmerge_kv_chunks(form, pairs, in, out, 0, g.num_layers);
            }));
    nlohmann::json codec = {{"name", "layer-merge"}, {"decode_seconds_per_byte", decode}};
    codec.update(qualities["layer-merge"]);
    std::fprintf(stderr, "layer-merge: decode %.3g ns per raw byte\n", decode * 1e9);
    out["codecs"].push_back(codec);
  }
  // Token dropping decodes nothing (kept chunks load raw): its profile is its quality alone. (H2O
  // is a fixed baseline: it needs each turn's observed attention.)
  for (const store::KnownItemCodec& known : store::kItemCodecs) {
    const std::string name(known.name);
    if (known.keep_fraction < 1 && !known.heavy_hitters && qualities.contains(name)) {
      nlohmann::json codec = {{"name", name}, {"decode_seconds_per_byte", 0.0}};
      codec.update(qualities[name]);
      out["codecs"].push_back(codec);
    }
  }
  if (!flags.has("qualities")) {
    std::fprintf(stderr,
                 "no --qualities: the profile has no codec quality; measure it with "
                 "bench/adaptcache_report.py --profile-out (docs/adaptcache.md)\n");
  }
  const std::string path = flags.get("output", "");
  std::ofstream file(path);
  file << out.dump(2) << "\n";
  file.close();
  if (!file) return internal_error("cannot write " + path);
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return Status();
}

}  // namespace

int run_profile(const std::vector<std::string>& args) {
  return exit_code("strata profile", profile(args));
}

}  // namespace strata::cli
