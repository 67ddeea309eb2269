#!/usr/bin/env bash
# Session 28, call 1: run15 (the gpu suite on a3e9110, then old vs new dense lines), then run12's
# Nsight Compute kernel tables of the landed tree (tests_s27a) at b256 and b1.
R=${OUT:-out}
mkdir -p "$R"
BENCH_S=${BENCH_S:-90} bash .gpu-pack/run15.sh
source .deps/env.sh
export RW_BUILD_DIR=/tmp/rw-old # run15 unpacked tests_s27a there
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
ctx=1024
[ "${mem:-0}" -lt 100000 ] && ctx=512
for p in "256 $ctx" "1 1024"; do
    set -- $p
    timeout 130 tools/gpu/kernel-times.sh "$1" "$2" > "$R/r16_ktimes_b$1_ctx$2.txt" 2>&1
    sed -n '/kernels, /,/^$/p' "$R/r16_ktimes_b$1_ctx$2.txt" | head -24
done
rm -f "$R"/kernel_times_*.csv
