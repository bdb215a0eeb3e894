#!/usr/bin/env bash
# The whole GPU check in one run on the GPU machine (see docs/gpu.md):
#   unpack the Debian packages fetched by scripts/fetch_gpu_deps.sh, build Strata against the
#   machine's own python3/torch for its GPU's architecture, run the `gpu` and `model` ctest labels,
#   and run the GPU benchmarks. Logs and results go to $OUT (or ./gpu-results).
#
# Device tool call (after scripts/fetch_gpu_deps.sh and fetching the default model here):
#   run(command="scripts/gpu-check.sh", carry=[".deps", ".cache/models"])
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-results}"
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

root="$PWD/.deps/root"
if [[ -d .deps/debs ]]; then
  mkdir -p "$root"
  for f in .deps/debs/*.deb; do dpkg -x "$f" "$root"; done
fi
multiarch="$root/usr/lib/x86_64-linux-gnu"
export PATH="$root/usr/bin:${PATH}"
export LD_LIBRARY_PATH="$multiarch:${LD_LIBRARY_PATH:-}"
export PKG_CONFIG_PATH="$multiarch/pkgconfig:$root/usr/share/pkgconfig"
python=$(command -v python3)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
arch=$("$python" -c 'import torch; p = torch.cuda.get_device_capability(); print(f"{p[0]}{p[1]}")')
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSTRATA_PYTHON="$python" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_PREFIX_PATH="$root/usr;$multiarch/cmake" || exit 1
cmake --build build-gpu -j"$(nproc)" || exit 1

status=0
# The model tests need the default model (carried in .cache/models, see docs/gpu.md) and the
# reference tools (transformers, gguf); without the model only the kernel tests run.
labels=(-L gpu -LE model)
[[ -f .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ]] && labels=(-L 'gpu|model|reference')
(cd build-gpu && ctest --output-on-failure "${labels[@]}" -j4 \
  --output-junit "$out/ctest-gpu.xml") || status=1
for bench in kernels_bench attention_bench leankv_attention_bench; do
  build-gpu/bench/$bench --json "$out/$bench.json" | tee "$out/$bench.txt" || status=1
done
# CachedAttention's loading paths on the GPU: requests share a 2,048-token prefix and the prefix
# cache is off, so every reuse is a load from the store's DRAM tier; 4 sequences run at a time and
# the rest wait, so the read buffer can pre-load them. recompute vs layer-wise loading within the
# pass (PL-B0, read_buffer_layers=0) vs the read buffer sized from measurements.
model=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ -f $model ]]; then
  # The start-up kernel self-check on this GPU (which ops serve with Strata's kernels, the
  # largest difference from libtorch, how long it took): /health of a short-lived server.
  build-gpu/bin/strata serve --model "$model" --device cuda --grpc-port 0 --http-port 18000 \
    >"$out/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 120); do
    curl -sf http://127.0.0.1:18000/health -o "$out/health.json" && break
    sleep 1
  done
  kill "$serve_pid"; wait "$serve_pid"
  [[ -s $out/health.json ]] || status=1
  build-gpu/bin/strata bench compare --model "$model" --device cuda --dataset-name random \
    --random-prefix-len 2048 --random-input-len 128 --random-output-len 16 --num-prompts 64 \
    --set kv_cache.enable_prefix_caching=false --set scheduler.max_num_seqs=4 \
    --variant recompute \
    --variant pl-b0:kv_store.dram_bytes=2GiB,kv_store.read_buffer_layers=0 \
    --variant read-buffer:kv_store.dram_bytes=2GiB \
    --no-plots --disable-tqdm --output-dir "$out/preload-compare" || status=1
fi
exit $status
