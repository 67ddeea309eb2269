#!/usr/bin/env bash
# Session 25 prepared (no machine lent then), call 1: the gpu suite on main + all5 (tests_s25a:
# the 128 x 96 one-wave tile, deeper wgmma stages, the quarter-SM tile target, clusters of 2
# sharing the activation copies, the sampler's chunk passes loading once, 128 x 256 lm_head tiles:
# test_gemm_gpu's batches of 256 and 300 rows hold every new tile to the old tiles' bits,
# test_kernels_gpu each sampled request alone to its batch); then the dense GEMMs at 64, 256 and
# 2048 tokens for base and each GEMM variant (one round; run6 times the steps, run7 tests the
# clusters of 4).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 270 tools/gpu/run-packed.sh .gpu-pack/tests_s25a.txz > "$R/r5_suite_a.txt" 2>&1
tail -26 "$R/r5_suite_a.txt"
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r5_failed_a.log"
rm -f "$R/suite.txt"
RW_VARIANT_TIMEOUT=40 timeout 290 tools/gpu/run-variants.sh --rounds 1 \
    --archive .gpu-pack/variants_s25.txz base tn96 wgdeep quarter all3 all3mc2 all3mc4 -- \
    $C kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 64,256,2048
mv "$R/variants.txt" "$R/r5_dense.txt"
python3 tools/bench/variant_lines.py "$R/r5_dense.txt" | grep -A8 '^dense'
