#!/usr/bin/env bash
# Builds Strata with sanitizers and runs the CPU test suite under them (after scripts/bootstrap.sh).
#
#   scripts/sanitize.sh address [CTEST ARGS]   AddressSanitizer + UndefinedBehaviorSanitizer, the
#                                              whole suite but fuzz_smoke (which has its own);
#                                              build-asan/
#   scripts/sanitize.sh thread [CTEST ARGS]    ThreadSanitizer, the engine, store, scheduler and
#                                              server tests; build-tsan/
#
# Every report fails its test (halt_on_error). libtorch, gRPC and the other system libraries are
# not instrumented: ASan sees their heap through its allocator, TSan their pthread calls only
# (see scripts/tsan.supp for what it cannot see through, each with its reason). Results:
# docs/results/sanitizers.md.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh address|thread [ctest args]}
targets=()  # everything
jobs=$(getconf _NPROCESSORS_ONLN)  # not nproc: it honours OMP_NUM_THREADS, set below
shift
export PATH="/usr/local/cuda/bin:$PATH"
case $kind in
  address)
    dir=build-asan
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    select=(-LE fuzz)
    ;;
  thread)
    dir=build-tsan
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$(pwd)/scripts/tsan.supp"
    # libtorch's intra-op pool (OpenMP) is not instrumented: its workers' hand-offs are invisible
    # to TSan. One intra-op thread keeps every ATen op on the calling thread.
    export OMP_NUM_THREADS=1
    select=(-R "engine|store|redis|scheduler|server|session|kv_cache|block_pool|restore|http_connections|layer_loader|freekv|attention_observer")
    # Only what those tests run: a TSan build of everything (emulator, benchmarks, model tests)
    # takes over an hour on 2 cores.
    targets=(--target strata engine_test engine_store_test scheduler_test kv_store_test
             kv_store_codecs_test redis_tier_test session_store_test kv_cache_manager_test
             block_pool_test layer_loader_test freekv_layer_test attention_observer_test)
    ;;
  *) echo "unknown sanitizer $kind" >&2; exit 2 ;;
esac
if [[ ! -f $dir/build.ninja ]]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g $flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
fi
cmake --build "$dir" -j"$jobs" "${targets[@]}"
cd "$dir"
ctest --output-on-failure -j"$jobs" "${select[@]}" "$@"
