#!/usr/bin/env bash
# Session 25 prepared, call 2 (after run5 says the variants keep the bits): the b1 and b256 steps,
# base against all5 (every GEMM and sampler change but the clusters of 4; two rounds; the engine
# line includes sampling, the forward line not); then the b256 step kernel by kernel (Nsight
# Compute, kernel-times.sh) on main's code (tests_s24) and on main + all5 (tests_s25a), which
# parts each change moved.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=90 timeout 300 tools/gpu/run-variants.sh --rounds 2 \
    --archive .gpu-pack/variants_smp.txz base all5 -- \
    $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant
mv "$R/variants.txt" "$R/r6_decode.txt"
python3 tools/bench/variant_lines.py "$R/r6_decode.txt" | grep -A4 '^decode'
for p in s24 s25a; do
    tools/gpu/run-packed.sh .gpu-pack/tests_$p.txz --unpack-only > /dev/null 2>&1
    RW_BUILD_DIR=${RW_PACK_DIR:-/tmp/rw-packed} timeout 120 tools/gpu/kernel-times.sh 256 \
        > "$R/r6_ktimes_$p.txt" 2>&1
    rm -f "$R"/kernel_times_*.csv
    sed -n '/kernels, /,/^$/p' "$R/r6_ktimes_$p.txt" | head -24
done
