// The restore coordinator's state of one sequence (RestoreCoordinator::Sequence): what it loads
// from the store, how its blocks hash, and its turn's save. Private to the restore coordinator.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "strata/kv/prefix_hash.h"
#include "strata/restore/restore_coordinator.h"
#include "strata/store/kv_store.h"

namespace strata::restore {

// A sequence the coordinator knows (every admitted one).
struct RestoreCoordinator::Sequence {
  SequenceInfo info;  // info.session is the store key (restore_coordinator.cpp: store_session_key)
  int64_t dropped_tokens = 0;  // prompt tokens dropped after the first block (context overflow)
  // A sequence resuming a token-dropped item found by content (its dropped tokens are the item's
  // skipped chunks) hashes its blocks on from the item's links: block 1 follows link
  // `skipped_chunks` of the prompt's chain, whose hash is `seed`. Its save is then found by
  // content like the item it resumed.
  struct ResumedLinks {
    int64_t skipped_chunks = 0;
    kv::ChunkHash seed;
  };
  std::optional<ResumedLinks> links;
  // What its first commit loads: the store item, and for each leading token block of the
  // sequence the item's chunk holding it.
  struct StoredPrefix {
    store::ItemId item = 0;
    std::vector<int64_t> chunks;
    int64_t skipped_chunks = 0;  // the item's when matched: token dropping since renumbers chunks
  };
  std::optional<StoredPrefix> stored;
  // The whole chunks of the item it restores (StoreMatch::whole_chunks: H2O's), which its save
  // passes on; 0 once it recomputes them.
  int64_t whole_chunks = 0;
  // Its stored chunks, pinned while it waits because the executor pre-loaded their first layers.
  std::optional<store::StoreLease> preloaded;
  // KvStore::num_publications() when it last looked its prompt up; a failed load stops lookups.
  int64_t lookup_at = 0;
  bool load_failed = false;
  // This turn's save (CachedAttention's asynchronous saving): each token block is copied out layer
  // by layer by the forward pass that completes it (blocks already resident when the save starts,
  // or that found no DRAM room then, by a later pass) into chunks the store reserved, published
  // when the turn ends. A save that found DRAM short publishes what it has written after each
  // pass, so the store can move it down a tier and make room for the rest (a turn longer than
  // DRAM is stored whole).
  struct Saving {
    store::SaveTicket ticket;                   // item 0: not begun (the store had no room yet)
    std::vector<kv::ChunkHash> chain;           // hashes of the sequence's blocks [0, chain.size())
    int64_t written = 0;                        // destinations handed to forward passes
    bool short_of_room = false;                 // the store reserved fewer chunks than asked for
    std::vector<std::function<void()>> copies;  // device-to-host copies that may be in flight
    double seconds = 0;                         // executor time on its copies
  };
  std::optional<Saving> saving;

  // Scored prompts are not stored; truncated history is found by session only, unless it keeps
  // a token-dropped item's links.
  bool saves_kv() const {
    return !info.scores_prompt && (dropped_tokens == 0 || !info.session.empty() || links);
  }
  // Truncated prompts and scored ones do not change what they load.
  bool may_look_up_again() const { return dropped_tokens == 0 && !info.scores_prompt; }
};

}  // namespace strata::restore
