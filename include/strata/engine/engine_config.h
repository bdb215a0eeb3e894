// The engine's scheduling configuration as the deployment file's scheduler section writes it
// (config::SchedulerSection derives from it and adds validation): the scheduler's own options,
// then the engine's admission rules. Plain header.
#pragma once

#include <cstdint>

#include "strata/scheduler/scheduler.h"

namespace strata::engine {

struct SchedulingConfig : scheduler::SchedulerConfig {
  // Requests that may wait for admission before submit() answers RESOURCE_EXHAUSTED (the servers
  // 429), so a burst cannot grow memory without bound.
  int64_t max_queued_requests = 1024;
  // A prompt that fills the context window: 0 rejects it at submit(); f in (0, 0.9] drops its
  // oldest history after the first block (whole blocks: the first block holds the attention sink
  // and the system prompt) so that the rest fills at most (1 - f) of the window. With a store the
  // kept history still loads, re-rotated to its new positions (CachedAttention's decoupled
  // truncation); a session's later turns keep at least the amount its stored KV dropped.
  double overflow_truncation_fraction = 0;

  bool operator==(const SchedulingConfig&) const = default;
};

}  // namespace strata::engine
