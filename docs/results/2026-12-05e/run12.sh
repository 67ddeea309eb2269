#!/usr/bin/env bash
# Prepared in session 26 for the next call: the b256 and b1 steps of the landed tree
# (tests_s26b, packed from f2c39b0) kernel by kernel under Nsight Compute, to see what the dense
# changes moved and what a b256 step is made of now. On an H100 the b256 step runs at ctx 512
# (b256 x 1k does not fit beside the weights); on an H200 at 1024 (the G1 point).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
tools/gpu/run-packed.sh .gpu-pack/tests_s26b.txz --unpack-only > /dev/null 2>&1
export RW_BUILD_DIR=${RW_PACK_DIR:-/tmp/rw-packed}
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
ctx=1024
[ "${mem:-0}" -lt 100000 ] && ctx=512
for p in "256 $ctx" "1 1024"; do
    set -- $p
    timeout 200 tools/gpu/kernel-times.sh "$1" "$2" > "$R/r12_ktimes_b$1_ctx$2.txt" 2>&1
    sed -n '/kernels, /,/^$/p' "$R/r12_ktimes_b$1_ctx$2.txt" | head -30
done
rm -f "$R"/kernel_times_*.csv
