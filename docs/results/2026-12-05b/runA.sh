#!/usr/bin/env bash
# The gpu suite again (test_quantized_update fixed for the high-precision builds) with the
# engine's prefill attention on the mma.sync kernel (RW_ATTN_WGMMA=0: what lands without the
# wgmma kernel), then call 2 (variants, atwdec, the precision's cost in one round).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
RW_ATTN_WGMMA=0 timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_next_run2.txz --jobs 3 > "$R/rA_suite.txt" 2>&1
echo "suite rc=$?" >> "$R/rA_suite.txt"
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/rA_failed.log"
RW_VARIANT_TIMEOUT=40 timeout 200 tools/gpu/run-variants.sh --rounds 2 base noet kbm kbm8 l2p128 l2p0 -- \
    decode --batches 1,8 --ctxs 1024,4096 --steps 20 --gen 1,16,2 --gen-reps 2 --no-quant
mv "$R/variants.txt" "$R/r2_variants.txt"
RW_VARIANT_TIMEOUT=30 timeout 100 tools/gpu/run-variants.sh --rounds 2 base atwdec -- \
    kernels --kernel-attention d32x8192,d8x8192,d8x4096,d1x1024 --expert-tokens 1 --dense-tokens 1
mv "$R/variants.txt" "$R/r2_atwdec.txt"
for p in standard high; do
    echo "=== $p" >> "$R/r2_precision.txt"
    timeout --foreground 50 /tmp/rw-variants/rw-base --config tools/configs/qwen3-30b-a3b.json \
        decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant \
        --precision $p >> "$R/r2_precision.txt" 2>&1
done
tail -25 "$R/rA_suite.txt"
python3 tools/bench/variant_lines.py "$R/r2_variants.txt" | tail -30
python3 tools/bench/variant_lines.py "$R/r2_atwdec.txt" | tail -14
grep -h '"what": "decode' "$R/r2_precision.txt" | cut -c1-220 | head -12
