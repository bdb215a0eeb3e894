#!/usr/bin/env bash
# Configures and builds Strata into build/ (Release, Ninja, ccache). Extra arguments are passed to
# `cmake --build` (e.g. `--target strata`). Assumes scripts/bootstrap.sh has run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j"$(nproc)" "$@"
