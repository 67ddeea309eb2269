#!/usr/bin/env bash
# Forty-fifth session, call 1: on an H200 the target rows G1 / G2 / G3 and G6 beside torch SDPA
# (docs/results/2026-12-07c/run2.sh, main's rw-bench), then the split decode's balance at
# 32 sequences: 3 splits x 2 warps = 6 warps a (sequence, kv head) walk 60, 64 or 66 segments
# (7680, 8192, 8448 keys): 10, 10.67 (the busiest 11) and 11 a warp. If the busiest warp sets
# the pace, 8192 takes about as long as 8448; if bytes do, 64/66 of it.
# Archive: .gpu-pack/variants.txz with rw-main built from main (3d803d5's code).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
RW_CALL_BUDGET=$((B - 60)) bash docs/results/2026-12-07c/run2.sh
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
X=/tmp/rw-variants/rw-main
for rep in 1 2 3; do
    timeout 40 $X $C kernels --kernel-attention d32x7680,d32x8192,d32x8448 --expert-tokens 1 \
        --dense-tokens 1 --small-tokens 1 > "$R/bal_$rep.jsonl" 2> "$R/bal_$rep.err"
    echo "balance rep $rep exit $?"
    grep -h attention "$R/bal_$rep.jsonl" | cut -c1-300
done
echo "all took $((SECONDS - s0)) s"
