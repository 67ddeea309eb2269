#!/usr/bin/env bash
# kernel-profile.sh - one kernel of a decode step under Nsight Compute, in depth: its sections
# (speed of light, issue, warp states, occupancy) and, per SASS instruction, how often it ran and
# how many warp-stall samples it took, summarized by tools/bench/sass_table.py. Use it on the one
# kernel a step table (kernel-times.sh) points at, not on whole steps: it replays each launch
# about forty times.
#
#   tools/gpu/kernel-profile.sh [--quant] [--count N] [--batch B] REGEX
#   tools/gpu/kernel-profile.sh --kernels 'ARGS' [--skip N] [--count N] REGEX
#
# REGEX is matched against the demangled kernel names (ncu -k regex:, e.g.
# 'moe_gemm_kernel<.int.32, .int.1, ' for the mxfp8 32-token expert tiles: template arguments
# print as '(int)32', which '.int.32' matches without escaping the parentheses). The first N
# (default 2) matching launches of the profiled step are profiled. --batch B (1 or 256, default
# 256) picks the forward entry's profiled step (RW_BENCH_NCU_BATCH, context 1024); --quant runs
# the mxfp8-last-8 model (b256 only): the bf16 step is profiled first, so name a quantized
# kernel or raise --count. Output in $OUT (or .): profile.ncu-rep, profile.txt (the sections),
# profile_sass.csv and profile_sass.txt (the table). --kernels profiles `rw-bench kernels ARGS`
# instead of a decode step (the kernel benches: prefill attention, expert passes at a token
# count, dense GEMMs), its first N matching launches after --skip N (default 0; pass
# --warmup 0 in ARGS, or skip the warm-up's launches). Environment: RW_BUILD_DIR (default
# build-gpu), RW_BENCH (an rw-bench to run instead of the build's, e.g. a packed variant's).
# About a minute on an H200.
set -euo pipefail
QUANT=0 COUNT=2 B=256 KARGS="" SKIP=0
while [ $# -gt 1 ]; do
    case "$1" in
    --quant) QUANT=1 ;;
    --count) shift; COUNT=$1 ;;
    --batch) shift; B=$1 ;;
    --kernels) shift; KARGS=$1 ;;
    --skip) shift; SKIP=$1 ;;
    *) echo "kernel-profile: unknown option $1 (see the top of $0)" >&2; exit 2 ;;
    esac
    shift
done
[ $# -eq 1 ] || {
    echo "usage: kernel-profile.sh [--quant] [--count N] [--batch B] REGEX" >&2
    echo "       kernel-profile.sh --kernels 'ARGS' [--skip N] [--count N] REGEX" >&2
    exit 2
}
REGEX=$1
case "$SKIP" in '' | *[!0-9]*) echo "kernel-profile: --skip takes a count of launches" >&2; exit 2 ;; esac
{ [ "$B" = 1 ] || [ "$B" = 256 ]; } || { echo "kernel-profile: --batch is 1 or 256" >&2; exit 2; }
{ [ "$QUANT" = 0 ] || [ "$B" = 256 ]; } || { echo "kernel-profile: --quant needs batch 256" >&2; exit 2; }
BUILD=${RW_BUILD_DIR:-build-gpu}
# the output folder is made if missing and taken as an absolute path before the cd below, as is
# RW_BENCH
DIR=${OUT:-.}
mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd)
BENCH=${RW_BENCH:-}
[ -z "$BENCH" ] || [ -x "$BENCH" ] || { echo "kernel-profile: RW_BENCH $BENCH is not a program" >&2; exit 1; }
[ -z "$BENCH" ] || BENCH=$(cd "$(dirname "$BENCH")" && pwd)/$(basename "$BENCH")
cd "$(dirname "$0")/../.."
command -v ncu > /dev/null || { echo "kernel-profile: ncu (Nsight Compute) is not on PATH" >&2; exit 1; }
if [ -z "$BENCH" ]; then
    BENCH=$BUILD/tools/bench/rw-bench
    [ -x "$BENCH" ] || { echo "kernel-profile: no $BENCH (build it first)" >&2; exit 1; }
fi
quant=(--no-quant)
[ "$QUANT" = 1 ] && quant=()
export RW_BENCH_NCU_BATCH=$B
# As in kernel-times.sh: rw-bench exits non-zero when any of its lines failed, among them lines
# the profile does not need (the forward b256 x 1k line on an 80 GB GPU); the profile decides.
rm -f "$DIR/profile.ncu-rep"
if [ -n "$KARGS" ]; then
    # the kernel benches: profiled from the start, the first SKIP matching launches passed over
    # (KARGS split into words on purpose)
    mode=(--launch-skip "$SKIP")
    # shellcheck disable=SC2206
    run=("$BENCH" kernels $KARGS)
else
    mode=(--profile-from-start off)
    run=("$BENCH" decode --batches "$B" --ctxs 1024 "${quant[@]}" --gen 1,16,2 --gen-reps 1 --steps 2)
fi
ncu --kernel-name-base demangled -k "regex:$REGEX" "${mode[@]}" --launch-count "$COUNT" \
    --set full --import-source no -f -o "$DIR/profile" "${run[@]}" > "$DIR/profile_run.log" 2>&1 ||
    { tail -20 "$DIR/profile_run.log" >&2; echo "kernel-profile: rw-bench failed a line (above)" >&2; }
[ -f "$DIR/profile.ncu-rep" ] || { echo "kernel-profile: nothing was profiled: no kernel matched '$REGEX', or the profiled step failed ($DIR/profile_run.log)" >&2; exit 1; }
ncu --import "$DIR/profile.ncu-rep" --page details > "$DIR/profile.txt"
ncu --import "$DIR/profile.ncu-rep" --page source --csv --print-source sass > "$DIR/profile_sass.csv"
python3 tools/bench/sass_table.py "$DIR/profile_sass.csv" | tee "$DIR/profile_sass.txt"
