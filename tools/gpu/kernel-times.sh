#!/usr/bin/env bash
# kernel-times.sh - the GPU time of every kernel of one decode step, measured by Nsight Compute:
# what a step is made of, kernel by kernel, to set beside the step time of the same build.
#
#   tools/gpu/kernel-times.sh [--quant] [BATCH [CTX]]     default 1 1024 (the G2 point)
#
# --quant: the mxfp8-last-8 model's step instead of bf16's, at G3's point 256 1024 (its default
# and the only point it takes; the forward entry profiles the bf16 step, then the mxfp8 one, and
# kernel_times.py --step 2 keeps the second).
#
# At BATCH 1 or 256 and CTX 1024 (G2, G1) rw-bench's forward-level decode benchmark runs its
# first timed step between cudaProfilerStart and cudaProfilerStop (RW_BENCH_NCU_BATCH); at any
# other point the engine's decode benchmark does so for its first timed step there
# (RW_BENCH_NCU_ENGINE=BATCH:CTX; that step includes the scheduler's work and sampling). ncu,
# started with profiling off, times each kernel of that step alone (launches serialized, caches
# and clocks left as they are). The CSV goes to $OUT (or .) as kernel_times_bBATCH_ctxCTX.csv
# and tools/bench/kernel_times.py prints the table: per kernel and grid, launches, total and
# mean time, and the sum.
# Environment: RW_BUILD_DIR (default build-gpu), OUT. Takes about a minute on an H200.
set -euo pipefail
QUANT=0
if [ "${1:-}" = --quant ]; then
    QUANT=1
    shift
fi
B=${1:-$((QUANT ? 256 : 1))}
C=${2:-1024}
BUILD=${RW_BUILD_DIR:-build-gpu}
DIR=${OUT:-.}
cd "$(dirname "$0")/../.."
command -v ncu > /dev/null || { echo "kernel-times: ncu (Nsight Compute) is not on PATH" >&2; exit 1; }
[ -x "$BUILD/tools/bench/rw-bench" ] || { echo "kernel-times: no $BUILD/tools/bench/rw-bench (build it first)" >&2; exit 1; }
quant=(--no-quant)
step=()
csv="$DIR/kernel_times_b${B}_ctx${C}.csv"
if [ "$QUANT" = 1 ]; then
    # rw-bench decodes with the mxfp8 model at the G1 point only
    { [ "$B" = 256 ] && [ "$C" = 1024 ]; } || { echo "kernel-times: --quant needs batch 256, context 1024" >&2; exit 1; }
    quant=()
    step=(--step 2)
    csv="$DIR/kernel_times_b${B}_ctx${C}_mxfp8.csv"
fi
if [ "$C" = 1024 ] && { [ "$B" = 1 ] || [ "$B" = 256 ]; }; then
    export RW_BENCH_NCU_BATCH=$B
else
    export RW_BENCH_NCU_ENGINE=$B:$C
fi
# rw-bench exits non-zero when any of its measurements failed, and its decode benchmark also runs
# lines this table does not need (on an 80 GB GPU the forward-level b256 x 1k line does not fit
# beside the weights): the table is printed from whatever step was profiled, with a warning.
rc=0
ncu --profile-from-start off --metrics gpu__time_duration.sum \
    --cache-control none --clock-control none --csv --page raw \
    "$BUILD/tools/bench/rw-bench" decode --batches "$B" --ctxs "$C" "${quant[@]}" --gen 1,16,2 \
    --gen-reps 1 --steps 5 > "$csv" || rc=$?
[ "$rc" = 0 ] || echo "kernel-times: rw-bench exited with status $rc (a measurement failed; its log is above)" >&2
grep -q gpu__time_duration "$csv" || { echo "kernel-times: no kernel was profiled ($csv)" >&2; exit 1; }
python3 tools/bench/kernel_times.py "$csv" "${step[@]}"
