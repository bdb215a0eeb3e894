#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan + UBSan) into build-fuzz/ and runs them.
#
#   scripts/fuzz.sh smoke [SECONDS]       every target: its regression inputs once, then SECONDS
#                                         (default 10) of fuzzing from the seeds; what the README's
#                                         test command runs (ctest fuzz_smoke)
#   scripts/fuzz.sh run RUNS [TARGET]     long runs (all targets, or one, one after the other on
#                                         one core): RUNS executions each (at most 4 hours); the
#                                         final stats go to docs/results/fuzz/TARGET.txt with the
#                                         command
#
# The working corpus lives in build-fuzz/corpus/TARGET (seeded from fuzz/seeds/TARGET); a crash
# or hang found is written to build-fuzz/findings/ and the run fails. Keep every fixed one as
# fuzz/regressions/TARGET/NAME.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:?usage: scripts/fuzz.sh smoke [SECONDS] | run RUNS [TARGET]}
targets=(http_framing grpc_request gguf safetensors openai_request tokenizer_json ssd_journal config
         redis_records)

if [[ ! -f build-fuzz/build.ninja ]]; then
  cmake -S . -B build-fuzz -G Ninja -DSTRATA_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
fi
cmake --build build-fuzz --target fuzz_all -j"$(nproc)"

# ASan's leak check at exit is on; UBSan stops at the first report.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p build-fuzz/findings

prepare_corpus() {  # target -> its working corpus directory
  local target=$1 corpus=build-fuzz/corpus/$1
  mkdir -p "$corpus"
  [[ -d fuzz/seeds/$target ]] && cp -n fuzz/seeds/"$target"/* "$corpus"/ 2>/dev/null || true
  if [[ $target == config ]]; then cp -n configs/*.yaml "$corpus"/; fi
  # Written afresh each time, so the seed writer runs as it does on a fresh clone.
  if [[ $target == ssd_journal ]]; then
    STRATA_FUZZ_WRITE_SEED="$corpus/seed-journal" build-fuzz/fuzz/ssd_journal_fuzz
  fi
  if [[ $target == redis_records ]]; then
    STRATA_FUZZ_WRITE_SEED="$corpus" build-fuzz/fuzz/redis_records_fuzz
  fi
  echo "$corpus"
}

case $mode in
  smoke)
    seconds=${2:-10}
    for target in "${targets[@]}"; do
      binary=build-fuzz/fuzz/${target}_fuzz
      corpus=$(prepare_corpus "$target")
      if compgen -G "fuzz/regressions/$target/*" >/dev/null; then
        "$binary" fuzz/regressions/"$target"/* >/dev/null 2>&1 ||
          { echo "FAIL $target: a regression input fails again"; "$binary" fuzz/regressions/"$target"/*; exit 1; }
      fi
      # -timeout: an input taking over 10 s is a hang; -rss_limit_mb bounds one input's memory.
      if ! "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
           -artifact_prefix=build-fuzz/findings/"$target"- "$corpus" >build-fuzz/"$target".log 2>&1; then
        echo "FAIL $target (log: build-fuzz/$target.log)"
        tail -40 build-fuzz/"$target".log
        exit 1
      fi
      echo "PASS $target: $(grep -o 'stat::number_of_executed_units: [0-9]*' build-fuzz/"$target".log |
                            awk '{print $2}') executions in ${seconds}s"
    done
    ;;
  run)
    runs=${2:?run needs RUNS}
    [[ -n ${3:-} ]] && targets=("$3")
    mkdir -p docs/results/fuzz
    for target in "${targets[@]}"; do
      binary=build-fuzz/fuzz/${target}_fuzz
      corpus=$(prepare_corpus "$target")
      log=build-fuzz/$target.run.log
      command="$binary -runs=$runs -max_total_time=14400 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 $corpus"
      start=$(date -u +%FT%TZ)
      commit=$(git rev-parse --short HEAD)
      status=0
      $command -artifact_prefix=build-fuzz/findings/"$target"- >"$log" 2>&1 || status=$?
      {
        echo "# $target: libFuzzer, ASan + UBSan, clang $(clang -dumpversion), $(nproc) cores"
        echo "# started $start, commit $commit, exit status $status"
        echo "# command (from the repository root, after scripts/fuzz.sh built build-fuzz/):"
        echo "#   scripts/fuzz.sh run $runs $target"
        echo "#   = $command"
        grep -E '^stat::|^#[0-9]+ *DONE|^Done [0-9]+ runs' "$log" || true
        echo "corpus_files: $(ls "$corpus" | wc -l)"
      } >docs/results/fuzz/"$target".txt
      echo "$target: exit $status, $(grep -o 'stat::number_of_executed_units: [0-9]*' "$log")"
    done
    ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
