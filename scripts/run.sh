#!/usr/bin/env bash
# Sets up everything (scripts/bootstrap.sh), builds, and starts an interactive chat with the
# default model (SmolLM2-135M-Instruct) on the GPU if there is one, else on the CPU.
# Extra arguments go to `strata chat` (see `build/bin/strata chat --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh --target strata
exec build/bin/strata chat --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
