#!/usr/bin/env bash
# Forty-fifth session, call 2 (an H100: no H200 came): the L2 policies made once a copy group /
# partial store (hoist) against main, first hoist's whole GPU suite, then the attention kernels
# in turns at 32 sequences x 7680, 8192, 8448 keys (the split's balance: 6 warps a sequence and
# kv head walk 60, 64 or 66 segments, 10, 10.67 (the busiest 11) and 11 a warp) and at 8 x 8k
# and 1 x 1k.
# Archives: .gpu-pack/tests_hoist.txz; .gpu-pack/variants.txz (rw-hoist, rw-main).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-300}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 120 tools/gpu/run-packed.sh .gpu-pack/tests_hoist.txz > "$R/suite.txt" 2>&1
echo "suite exit $?"; tail -2 "$R/suite.txt"
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
VT=$((B - (SECONDS - s0) - 10))
if [ $VT -ge 60 ]; then
    OUT=$R/v RW_VARIANT_TIMEOUT=45 timeout $VT tools/gpu/run-variants.sh --rounds 2 main hoist -- \
        $C kernels --kernel-attention d32x7680,d32x8192,d32x8448,d8x8192,d1x1024 \
        --expert-tokens 1 --dense-tokens 1 --small-tokens 1
    python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "attention"
    mv "$R/v/variants.txt" "$R/variants.txt"; rm -rf "$R/v"
fi
echo "all took $((SECONDS - s0)) s"
