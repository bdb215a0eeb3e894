#include "item_codecs.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "strata/common/hex.h"

namespace strata::restore {
namespace {

// Reads the profile into the codecs' qualities and decode costs and the tiers' bandwidths.
Status read_profile(const std::string& path, uint64_t model_fingerprint,
                    store::StoreOptions* options) {
  std::ifstream in(path);
  if (!in) return not_found_error("adaptcache.profile: cannot read " + path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& what) {
    return invalid_argument_error("adaptcache.profile " + path + ": " + what);
  };
  if (!j.is_object() || !j.contains("prefill_seconds_per_token") || !j["prefill_seconds_per_token"].is_number() ||
      !j.contains("tiers") || !j["tiers"].is_array() || !j.contains("codecs") || !j["codecs"].is_array()) {
    return bad("expected an object with prefill_seconds_per_token, tiers and codecs");
  }
  // Its prefill cost and codec qualities are one model's: another model's profile is refused.
  const std::string served = hex64(model_fingerprint);
  if (!j.contains("model_fingerprint")) {
    spdlog::warn(
        "adaptcache.profile {} names no model: its numbers are taken as those of the "
        "served model ({})",
        path, served);
  } else if (!j["model_fingerprint"].is_string() ||
             j["model_fingerprint"].get<std::string>() != served) {
    return failed_precondition_error("adaptcache.profile " + path +
                                     " was measured with another model (fingerprint " +
                                     j["model_fingerprint"].dump() + ", the served one " + served +
                                     "): measure this one with `strata profile`");
  }
  store::AdaptCacheOptions& ac = options->adaptcache;
  ac.prefill_seconds_per_token = j["prefill_seconds_per_token"].get<double>();
  std::vector<std::string> names = {"dram"};
  for (const store::SsdOptions& t : options->tiers) names.push_back(t.name);
  for (const std::string& name : names) {
    const auto it = std::find_if(j["tiers"].begin(), j["tiers"].end(), [&](const nlohmann::json& t) {
      return t.is_object() && t.value("name", "") == name;
    });
    if (it == j["tiers"].end() || !(*it)["bandwidth"].is_number()) {
      return bad("no bandwidth for the " + name + " tier");
    }
    ac.bandwidth.push_back((*it)["bandwidth"].get<double>());
    ac.latency_seconds.push_back(it->value("latency_seconds", 0.0));
  }
  // AdaptCache chooses among the codecs the profile lists (each with its quality); the others it
  // leaves out (quality < 0).
  for (store::ItemCodec& codec : options->codecs) codec.quality = -1;
  for (const nlohmann::json& c : j["codecs"]) {
    const std::string name = c.is_object() ? c.value("name", "") : "";
    const auto codec = std::find_if(options->codecs.begin(), options->codecs.end(),
                                    [&](const store::ItemCodec& k) { return k.name == name; });
    if (codec == options->codecs.end()) {
      return bad("unknown codec '" + name + "' (" + std::string(store::kItemCodecChoices) + ")");
    }
    if (!c.contains("quality") || !c["quality"].is_number()) {
      return bad("no quality for codec " + name);
    }
    if (codec->quality >= 0) return bad("codec " + name + " is listed twice");
    codec->quality = c["quality"].get<double>();
    codec->decode_seconds_per_byte = c.value("decode_seconds_per_byte", 0.0);
    // Quality per task family: {"chat": 0.93, "long-document": 0.71}. Every listed codec gives
    // the same families (the first one names them).
    const nlohmann::json none = nlohmann::json::object();
    const nlohmann::json& by_task = c.contains("task_quality") ? c["task_quality"] : none;
    if (!by_task.is_object()) return bad("codec " + name + ": task_quality must be an object");
    if (&c == &j["codecs"].front()) {
      for (const auto& [task, q] : by_task.items()) ac.tasks.push_back(task);
    }
    if (by_task.size() != ac.tasks.size()) {
      return bad("codec " + name + " has quality for " + std::to_string(by_task.size()) +
                 " task families, the first codec for " + std::to_string(ac.tasks.size()));
    }
    for (const std::string& task : ac.tasks) {
      if (!by_task.contains(task) || !by_task[task].is_number()) {
        return bad("codec " + name + " has no quality for task family '" + task + "'");
      }
      codec->task_quality.push_back(by_task[task].get<double>());
    }
  }
  return Status();
}

}  // namespace

kv::krul::MergedForm merged_form(const store::StoreConfig& config,
                                 const executor::Executor& executor) {
  const kv::KvGeometry& g = executor.kv_geometry();
  return kv::krul::merged_form(config.layer_share, config.merge_retain, g.num_layers,
                               int64_t{g.num_kv_heads} * g.block_size_tokens);
}

StatusOr<std::vector<std::optional<kv::KvFormat>>> configure_item_codecs(
    const store::StoreConfig& store_config, const executor::Executor& executor,
    uint64_t model_fingerprint, store::StoreOptions* options) {
  const store::AdaptCacheConfig& config = store_config.adaptcache;
  std::vector<std::optional<kv::KvFormat>> formats = {std::nullopt};
  if (!config.enabled && config.fixed_codec == "none") return formats;
  // Token-dropped chunks are raw: they load like the pool's; merged ones are made raw before
  // their load (no format).
  const kv::krul::MergedForm form = merged_form(store_config, executor);
  for (const store::KnownItemCodec& known : store::kItemCodecs) {
    // The layer merge needs the conversations' layer pairs.
    if (known.layer_merge && store_config.layer_pairing == store::LayerPairing::kNone) continue;
    // H2O is a fixed baseline (its turns' attention is observed only then), not AdaptCache's.
    if (known.heavy_hitters && config.fixed_codec != known.name) continue;
    std::optional<kv::KvFormat> format;
    if (known.kivi_bits > 0) format = kv::kivi_format(known.kivi_bits);
    formats.push_back(format);
    options->codecs.push_back({.name = std::string(known.name),
                               .chunk_bytes = format              ? executor.kv_chunk_bytes(*format)
                                              : known.layer_merge ? executor.kv_chunk_bytes(form)
                                                                  : executor.kv_chunk_bytes(),
                               .keep_fraction = known.keep_fraction,
                               .heavy_hitters = known.heavy_hitters,
                               .merged_pairs = known.layer_merge ? form.pairs : 0,
                               .task_quality = {}});
  }
  if (!config.enabled) {
    for (size_t i = 0; i < options->codecs.size(); ++i) {
      if (options->codecs[i].name == config.fixed_codec) options->fixed_codec = static_cast<int32_t>(i + 1);
    }
    if (options->fixed_codec == 0) {
      return invalid_argument_error("adaptcache.fixed_codec must be " +
                                    std::string(store::kItemCodecChoices) + ", got '" +
                                    config.fixed_codec + "'");
    }
  } else {
    options->adaptcache.enabled = true;
    options->adaptcache.alpha = config.alpha;
    options->adaptcache.half_life_seconds = config.half_life_seconds;
    STRATA_RETURN_IF_ERROR(read_profile(config.profile, model_fingerprint, options));
  }
  const executor::Executor* e = &executor;
  options->keep_heavy_hitters =
      [e](std::span<const float> mass, std::span<const std::byte* const> in,
          std::span<std::byte* const> out) { return e->keep_heavy_hitters(mass, in, out); };
  // Index-aligned with the store's codecs, "none" first: whether each merges layers.
  std::vector<bool> merges = {false};
  for (const store::ItemCodec& codec : options->codecs) merges.push_back(codec.merged_pairs > 0);
  options->transcode = [e, formats, form, merges](
                           int32_t from, int32_t to, const std::vector<kv::krul::LayerPair>& pairs,
                           std::span<const std::byte* const> in, std::span<std::byte* const> out) {
    // A layer merge is its own method (AdaptCache never moves an item out of it): raw chunks in.
    if (merges[to] && from == 0) return e->merge_kv_chunks(form, pairs, in, out);
    if (merges[to] || merges[from]) {
      return unimplemented_error("merged KV chunks are made from raw ones only");
    }
    return e->transcode_kv_chunks(formats[from], formats[to], in, out);
  };
  return formats;
}

}  // namespace strata::restore
