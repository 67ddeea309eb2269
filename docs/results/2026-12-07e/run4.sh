#!/usr/bin/env bash
# Forty-sixth session: three orders of the prefill kernel's two softmax blocks against main, in
# turns on the prefill attention kernel alone (no tests: timing only): pipe (both blocks'
# q'.K^T first, pipe.patch), mid (the second block's q'.K^T after the first's softmax, before
# its P.V, mid.patch), unroll (main's loop unrolled, unroll.patch).
# Archive: .gpu-pack/variants.txz (main = the working tree of cff7c2c + atc_softmax_pv split).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/f_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=30 timeout 150 tools/gpu/run-variants.sh --rounds 3 main pipe mid unroll -- $C \
    kernels --kernel-attention p8x2048,p1x8192 --expert-tokens 1 --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/f_kernels.txt"
python3 tools/bench/variant_lines.py "$R/f_kernels.txt" --what 'attention'
