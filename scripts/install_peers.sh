#!/usr/bin/env bash
# Installs the peer engines `strata bench` runs side by side, each in its own virtual environment
# under .peers/ (kept apart from .venv, whose torch the build uses). Idempotent.
#   llama.cpp: llama-cpp-python[server] from PyPI, built from source for this CPU
#              (.peers/llama-cpp/bin/python -m llama_cpp.server serves an OpenAI-compatible API)
# Building llama.cpp takes about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly LLAMA_CPP_PYTHON="llama-cpp-python[server]==0.3.36"
readonly VENV=".peers/llama-cpp"

if [[ -f "$VENV/.installed" && "$(cat "$VENV/.installed")" == "$LLAMA_CPP_PYTHON" ]]; then
  exit 0
fi
echo "[peers] building $LLAMA_CPP_PYTHON from source into $VENV" >&2
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Not GGML_NATIVE: on CPUs that report AMX (Sapphire Rapids and later) a native build uses AMX
# tiles, and where the kernel has not granted them (VMs) llama_decode segfaults. The portable
# x86-64 build keeps AVX2/FMA/F16C.
CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$VENV/bin/python" -m pip install -q --force-reinstall --no-cache-dir \
  --no-binary llama-cpp-python "$LLAMA_CPP_PYTHON"
echo "$LLAMA_CPP_PYTHON" >"$VENV/.installed"
