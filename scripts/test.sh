#!/usr/bin/env bash
# Sets up everything (scripts/bootstrap.sh), builds all targets and runs the whole test suite
# with ctest. GPU tests (label gpu) skip themselves when no CUDA device is present.
# Extra arguments go to ctest (e.g. `-L unit`, `-R tokenizer`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
