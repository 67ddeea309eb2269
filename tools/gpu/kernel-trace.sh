#!/usr/bin/env bash
# kernel-trace.sh - every kernel of a program's run timed where it ran: in its CUDA graph, beside
# the kernels that programmatic launch lets overlap it. CUPTI's activity records, taken inside the
# program by tools/gpu/ktrace.c (preloaded); Nsight Compute (kernel-times.sh) times each kernel
# alone instead, so its sum is not the step.
#
#   tools/gpu/kernel-trace.sh OUT.csv -- PROGRAM [ARGS...]
#   tools/bench/kernel_trace.py OUT.csv [--graph G] [--sequence N] [--phases]
#
# e.g. OUT.csv -- build-gpu/tools/bench/rw-bench decode --batches 1 --ctxs 1024 --no-quant
# --steps 10 --gen 1,16,2 --gen-reps 1. The library is built first (gcc, CUDA's cupti.h and
# libcupti), into a temporary directory. Takes the program's time plus a little.
set -euo pipefail
[ $# -ge 3 ] && [ "$2" = -- ] || { sed -n '2,13p' "$0" >&2; exit 2; }
out=$1
shift 2
cuda=${CUDA_HOME:-/usr/local/cuda}
lib=
for d in "$cuda/extras/CUPTI/lib64" "$cuda/targets/x86_64-linux/lib" "$cuda/lib64"; do
    [ -e "$d/libcupti.so" ] && { lib=$d; break; }
done
[ -n "$lib" ] || { echo "kernel-trace: no libcupti.so under $cuda" >&2; exit 1; }
inc=$cuda/include
[ -e "$inc/cupti.h" ] || inc=$cuda/extras/CUPTI/include
[ -e "$inc/cupti.h" ] || { echo "kernel-trace: no cupti.h under $cuda" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -std=c11 -O2 -shared -fPIC -I"$inc" "$(dirname "$0")/ktrace.c" -o "$tmp/libktrace.so" \
    -L"$lib" -lcupti -Wl,-rpath,"$lib"
RW_KTRACE_OUT=$out LD_PRELOAD=$tmp/libktrace.so${LD_PRELOAD:+:$LD_PRELOAD} "$@"
[ -s "$out" ] || { echo "kernel-trace: nothing traced (see ktrace's message above)" >&2; exit 1; }
echo "kernel-trace: $(($(wc -l < "$out") - 1)) kernels in $out" >&2
