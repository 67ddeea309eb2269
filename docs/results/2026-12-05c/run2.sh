#!/usr/bin/env bash
# Session 24, call 2: the copy rate after a free, over time; the staged attention combine against
# the previous one; the L2 promotion patch on decode steps; the gpu suite of the tree (new
# combine: test_kernels_gpu compares split and unsplit attention byte for byte).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 100 python3 tools/gpu/hbm_probe.py --series 100 > "$R/r2_hbm_probe.txt" 2>&1
grep -v 'after the free' "$R/r2_hbm_probe.txt"; grep 'after the free' "$R/r2_hbm_probe.txt" | awk 'NR%5==1' | cut -c1-120
RW_VARIANT_TIMEOUT=50 timeout 150 tools/gpu/run-variants.sh --rounds 2 base oldcomb -- \
    $C kernels --kernel-attention d32x8192,d8x8192,d8x4096,d1x1024 --expert-tokens 1 --dense-tokens 1
mv "$R/variants.txt" "$R/r2_combine.txt"
python3 tools/bench/variant_lines.py "$R/r2_combine.txt" | grep -A3 attention_decode
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_s24.txz > "$R/r2_suite.txt" 2>&1
tail -26 "$R/r2_suite.txt"
RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 2 base oldcomb l2p0 -- \
    $C decode --batches 1,8 --ctxs 1024,8192 --steps 20 --gen 1,16,2 --gen-reps 1 --no-quant
mv "$R/variants.txt" "$R/r2_decode.txt"
python3 tools/bench/variant_lines.py "$R/r2_decode.txt" | grep -A4 '^decode'
