#!/usr/bin/env bash
# Builds rw and runs the test suites: 'cpu' everywhere, 'gpu' where a CUDA device exists (its
# tests report SKIP otherwise), then the 60-second 'soak' suite. `tools/test.sh --sanitize`
# builds a CPU-only ASan+UBSan tree in ./build-asan and runs the cpu suite there.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
if [ "${1:-}" = "--sanitize" ]; then
    shift
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    RW_BUILD_DIR=build-asan RW_CUDA=disabled \
        RW_MESON_ARGS="-Db_sanitize=address,undefined -Db_lundef=false" tools/build.sh
    meson test -C build-asan --suite cpu --print-errorlogs --timeout-multiplier 4 "$@"
else
    tools/build.sh
    meson test -C "${RW_BUILD_DIR:-build}" --print-errorlogs --no-suite soak "$@"
    # the soak test on its own: one worker under trainers, clients and a hostile client for
    # RW_SOAK_SECONDS (default 60; docs/OPERATIONS.md section 7)
    if [ $# -eq 0 ]; then
        meson test -C "${RW_BUILD_DIR:-build}" --print-errorlogs --suite soak
    fi
fi
