#!/bin/bash
# FreeKV against full attention, synchronous retrieval and StreamingLLM on Qwen2.5-Coder-1.5B at
# long contexts (docs/results/cpu-freekv.md). Full attention runs first and its KV store keeps
# every prompt on the SSD tier; the other variants load them from there (--warm-store), so each
# long prompt is computed once.
#
#   bench/freekv_long_context.sh niah 16k|32k    needles at 75% and 25% of a 16K / 32K haystack
#   bench/freekv_long_context.sh multikey 16k|32k K   K keyed needles in one 16K / 32K document,
#                                                a question for each (one long prefill in all)
#   bench/freekv_long_context.sh steps 16k|32k   decode steps again over the stored prompts (run
#                                                niah first), 2 threads and 1 thread
#   bench/freekv_long_context.sh bamboo N        BAMBOO paperqa_16k, the first N questions
#   bench/freekv_long_context.sh leval N         L-Eval financial_qa (open-ended), N questions
#
# Work files under ${WORK:-/var/tmp}: the prompts, the SSD tiers (emptied first, except by steps),
# the compare outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=$1 arg=$2
work=${WORK:-/var/tmp}
model=.cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
variants=(--variant 'full:freekv.enabled=false'
          --variant 'freekv:freekv.enabled=true'
          --variant 'synchronous:freekv.enabled=true,freekv.tau=2'
          --variant 'streamingllm:freekv.enabled=true,freekv.window_tokens=1536')
compare() {  # compare NAME FLAGS...: the four variants (and any more in FLAGS) on NAME's store
  local name=$1
  shift
  build/bin/strata bench compare --model "$model" --workload longqa --max-concurrency 1 \
    --warm-store --set model.dtype=bfloat16 --set kv_cache.enable_prefix_caching=false \
    --set kv_cache.max_context_tokens=32768 --set kv_cache.cache_bytes=1536MiB \
    --set kv_store.dram_bytes=2GiB --set "kv_store.ssd_dir=$work/$name-kv" \
    --set kv_store.ssd_bytes=8GiB \
    --set freekv.page_tokens=32 --set freekv.sink_tokens=512 --set freekv.window_tokens=512 \
    --set freekv.budget_tokens=2048 --set freekv.min_context_tokens=4096 \
    "${variants[@]}" "$@" --no-plots --disable-tqdm
}
needles() {  # needles NAME DATA OUT: the variants over DATA's needle prompts on NAME's store, scored
  compare "$1" --dataset-path "$2" --max-input-len $((tokens + 600)) --max-output-len 24 \
    --output-dir "$3"
  .venv/bin/python bench/niah.py score "$3/compare.json" --reference full
}
tokens=$([ "$arg" = 16k ] && echo 16000 || echo 32000)  # niah, steps and multikey
case $mode in
  niah | steps)
    data=$work/niah-$arg.jsonl
    if [ "$mode" = niah ]; then
      rm -rf "$work/niah-$arg-kv"
      .venv/bin/python bench/niah.py generate --model "$model" --context-tokens "$tokens" \
        --depths 0.75,0.25 --output "$data"
      out=$work/niah-out-$arg
    else
      variants+=(--variant 'full-1t:freekv.enabled=false,devices.cpu_threads=1'
                 --variant 'freekv-1t:freekv.enabled=true,devices.cpu_threads=1'
                 --variant 'synchronous-1t:freekv.enabled=true,freekv.tau=2,devices.cpu_threads=1')
      out=$work/niah-steps-$arg
    fi
    needles "niah-$arg" "$data" "$out"
    ;;
  multikey)
    data=$work/niah-$arg-keys.jsonl
    rm -rf "$work/niah-$arg-keys-kv"
    .venv/bin/python bench/niah.py generate --model "$model" --context-tokens "$tokens" \
      --keys "${3:?multikey needs the number of keys}" --output "$data"
    needles "niah-$arg-keys" "$data" "$work/niah-keys-out-$arg"
    ;;
  bamboo)
    rm -rf "$work/bamboo-kv"
    compare bamboo --dataset-path ../shared/data/longctx/bamboo/paperqa_16k.jsonl.xz \
      --num-prompts "$arg" --max-input-len 16000 --max-output-len 4 --output-dir "$work/bamboo-out"
    ;;
  leval)
    rm -rf "$work/leval-kv"
    compare leval --dataset-path ../shared/data/longctx/leval/Open-ended-tasks/financial_qa.jsonl.xz \
      --num-prompts "$arg" --max-input-len 16000 --max-output-len 64 --output-dir "$work/leval-out"
    ;;
  *)
    echo "usage: $0 niah|steps 16k|32k, multikey 16k|32k K, or bamboo|leval N" >&2
    exit 2
    ;;
esac
