#!/usr/bin/env bash
# Session 33, call 2 (the warm H100 after run3.sh): Nsight Compute's full sections on the RoPE +
# KV write, router and sort kernels of a b256 x 512 engine step, main's rw-bench (variants.txz's
# base). Its 130 s limit stopped it during the router: r4_ncu_small.txt holds the RoPE launch.
source .deps/env.sh
R=${OUT:-out}
export RW_BENCH_NCU_ENGINE=256:512
timeout 100 ncu --profile-from-start off --kernel-name-base demangled \
    -k "regex:qk_rope_kv|router_kernel|sort_kernel" --launch-count 3 --set full --import-source no \
    -f -o /tmp/sm /tmp/rv/rw-base decode --batches 256 --ctxs 512 --no-quant --gen 1,16,2 \
    --gen-reps 1 --steps 2 > /tmp/sm.log 2>&1
echo rc $?
ncu --import /tmp/sm.ncu-rep --page details > "$R/r4_ncu_small.txt" 2>&1
