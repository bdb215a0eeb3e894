#!/usr/bin/env bash
# Sets up everything (scripts/bootstrap.sh), builds, and serves the default model
# (SmolLM2-135M-Instruct) over gRPC on 127.0.0.1:50051 and OpenAI-compatible HTTP on
# 127.0.0.1:8000, on the GPU if there is one, else on the CPU, until Ctrl-C. Chat with it from
# another terminal: build/bin/strata chat
# Finished conversation turns keep their KV in a 512 MiB DRAM tier and a 2 GiB SSD tier under
# .cache/kv-store (CachedAttention; docs/kv-store.md), so a conversation's next turn, and a restart
# of the server, do not recompute its history. Settings: configs/default.yaml (requests that leave
# sampling fields unset get llama.cpp's defaults), on the GPU when there is one.
# Extra arguments go to `strata serve` (see `build/bin/strata serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh --target strata
exec build/bin/strata serve --config configs/default.yaml --set devices.device=auto \
  --set model.dtype=auto "$@"
