// The KV store's lossy item codecs for this executor's chunks (store/item_codecs.h), from the
// deployment's adaptcache section: KIVI at 8, 4 and 2 bits, StreamingLLM token dropping keeping
// 1/2, 1/4 and 1/10 of the chunks, Krul's layer merge of the conversation's layer pairs
// (kv_store.layer_pairing), the transcoder the executor provides, and for AdaptCache the
// profile file's numbers (the codecs it lists, with their quality, are AdaptCache's choices).
// Private to the restore coordinator.
#pragma once

#include <optional>
#include <vector>

#include "strata/common/status.h"
#include "strata/executor/executor.h"
#include "strata/store/kv_store.h"

namespace strata::restore {

// Sets options->codecs, transcode, fixed_codec and adaptcache (the tiers in options->tiers must be
// set). Returns each codec's format, index-aligned with the store's codecs ("none" first:
// nullopt). INVALID_ARGUMENT for an unknown fixed codec; NOT_FOUND / INVALID_ARGUMENT naming the
// profile file when it is missing or malformed, FAILED_PRECONDITION when it names another model
// than `model_fingerprint` (one naming none is taken, with a warning).
StatusOr<std::vector<std::optional<kv::KvFormat>>> configure_item_codecs(
    const store::StoreConfig& config, const executor::Executor& executor,
    uint64_t model_fingerprint, store::StoreOptions* options);

// The layer-merge codec's form for this deployment: the pairs kv_store.layer_share asks for
// (kv::krul::pair_count), at most merge_retain of each chunk's vectors per pair and K or V kept.
kv::krul::MergedForm merged_form(const store::StoreConfig& config,
                                 const executor::Executor& executor);

}  // namespace strata::restore
