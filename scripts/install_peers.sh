#!/usr/bin/env bash
# Installs the peer engines `strata bench` runs side by side under .peers/ (kept apart from .venv,
# whose torch the build uses). Idempotent.
#   llama-server: llama.cpp's own OpenAI-compatible server with continuous batching (-np slots),
#              built from the llama.cpp source vendored in the llama-cpp-python sdist below
#              (.peers/llama-server/bin/llama-server)
#   llama-cpp-python[server]: the same llama.cpp behind a single-slot Python server
#              (.peers/llama-cpp/bin/python -m llama_cpp.server)
# Building takes about 10 minutes each on 2 cores. `scripts/install_peers.sh llama-server` builds
# only the first.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly LLAMA_CPP_PYTHON_VERSION="0.3.36"
readonly LLAMA_CPP_PYTHON="llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
readonly VENV=".peers/llama-cpp"
readonly SERVER_DIR=".peers/llama-server"

# ggml's CPU flags: the build for this CPU (AVX-512 where it has it), except on CPUs that report
# AMX (Sapphire Rapids and later): there a native build uses AMX tiles, and where the kernel has
# not granted them (VMs) llama_decode segfaults, so the portable x86-64 build (AVX2/FMA/F16C).
ggml_cpu_flags() {
  if grep -q -w amx_tile /proc/cpuinfo 2>/dev/null; then
    echo "-DGGML_NATIVE=OFF"
  else
    echo "-DGGML_NATIVE=ON"
  fi
}

install_llama_server() {
  if [[ -f "$SERVER_DIR/.installed" && "$(cat "$SERVER_DIR/.installed")" == "$LLAMA_CPP_PYTHON_VERSION" ]]; then
    return
  fi
  echo "[peers] building llama-server from the llama.cpp of llama-cpp-python $LLAMA_CPP_PYTHON_VERSION" >&2
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  .venv/bin/python -m pip download -q --no-binary :all: --no-deps \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work"
  tar -xzf "$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$work"
  local src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
  cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $(ggml_cpu_flags) \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    >/dev/null
  cmake --build "$work/build" --target llama-server -j "$(nproc)" >/dev/null
  mkdir -p "$SERVER_DIR/bin"
  cp "$work/build/bin/llama-server" "$SERVER_DIR/bin/llama-server"
  echo "$LLAMA_CPP_PYTHON_VERSION" >"$SERVER_DIR/.installed"
}

install_llama_cpp_python() {
  if [[ -f "$VENV/.installed" && "$(cat "$VENV/.installed")" == "$LLAMA_CPP_PYTHON" ]]; then
    return
  fi
  echo "[peers] building $LLAMA_CPP_PYTHON from source into $VENV" >&2
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  CMAKE_ARGS="$(ggml_cpu_flags)" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/python" -m pip install -q --force-reinstall --no-cache-dir \
    --no-binary llama-cpp-python "$LLAMA_CPP_PYTHON"
  echo "$LLAMA_CPP_PYTHON" >"$VENV/.installed"
}

install_llama_server
[[ "${1:-}" == "llama-server" ]] || install_llama_cpp_python
