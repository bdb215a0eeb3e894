#!/usr/bin/env bash
# Strata against llama.cpp's own llama-server on the CPU, side by side with `strata bench
# compare`: the same GGUF, machine and threads; both servers started fresh for each concurrency
# (no prompt cache carried over), llama-server with as many parallel slots as the concurrency.
#
#   bench/vs_llama_server.sh OUT_DIR [MODEL.gguf] [THREADS] [CONCURRENCY...]
#
# Needs build/bin/strata and .peers/llama-server/bin/llama-server (scripts/install_peers.sh
# llama-server). Writes OUT_DIR/c<N>/compare.{json,md} and ttft_cdf.png per concurrency, and the
# servers' logs beside them.
# Extra `strata serve` flags come from STRATA_FLAGS (e.g. "--weights dequantize").
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:?usage: bench/vs_llama_server.sh OUT_DIR [MODEL.gguf] [THREADS] [CONCURRENCY...]}"
model="${2:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
threads="${3:-2}"
shift $(($# < 3 ? $# : 3))
concurrencies=("$@")
[[ ${#concurrencies[@]} -gt 0 ]] || concurrencies=(1 4 16)
readonly strata_port=8000 llama_port=8080
mkdir -p "$out"

pids=()
stop_servers() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_servers EXIT

wait_ready() {  # url
  for _ in $(seq 1 120); do
    curl -sf "$1" >/dev/null && return
    sleep 1
  done
  echo "error: $1 did not come up" >&2
  exit 1
}

for c in "${concurrencies[@]}"; do
  prompts=$((c >= 16 ? 2 * c : 16))
  build/bin/strata serve --model "$model" --http-port "$strata_port" --grpc-port 0 \
    --threads "$threads" ${STRATA_FLAGS:-} >"$out/strata-c$c.log" 2>&1 &
  pids+=($!)
  .peers/llama-server/bin/llama-server -m "$model" --port "$llama_port" -np "$c" -c 32768 \
    -t "$threads" >"$out/llama-server-c$c.log" 2>&1 &
  pids+=($!)
  wait_ready "http://127.0.0.1:$strata_port/health"
  wait_ready "http://127.0.0.1:$llama_port/health"
  build/bin/strata bench compare --model "$model" \
    --dataset-name sharegpt --dataset-path ../shared/data/sharegpt/sharegpt_v3_sample1000.json.xz \
    --num-prompts "$prompts" --sharegpt-output-len 64 --ignore-eos --max-concurrency "$c" \
    --seed 0 --peer strata="http://127.0.0.1:$strata_port" \
    --peer llama-server="http://127.0.0.1:$llama_port" --output-dir "$out/c$c" --disable-tqdm
  stop_servers
done
