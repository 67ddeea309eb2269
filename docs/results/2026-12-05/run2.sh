#!/usr/bin/env bash
# Call 2: the variants (variants.txz: base = main + next_run2.patch; noet = without the early
# trigger; kbm, kbm8 = the k-block-major GEMV timing patches; l2p128, l2p0 = L2 promotion;
# atwdec = decode tiles of split launches on the wgmma attention kernel), then the
# high-precision mode's cost on the base binary, standard and high in turns.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
RW_VARIANT_TIMEOUT=40 timeout 220 tools/gpu/run-variants.sh --rounds 2 base noet kbm kbm8 l2p128 l2p0 -- \
    decode --batches 1,8 --ctxs 1024,4096 --steps 20 --gen 1,16,2 --gen-reps 2 --no-quant
mv "$R/variants.txt" "$R/r2_variants.txt"
RW_VARIANT_TIMEOUT=30 timeout 110 tools/gpu/run-variants.sh --rounds 2 base atwdec -- \
    kernels --kernel-attention d32x8192,d8x8192,d8x4096,d1x1024 --expert-tokens 1
mv "$R/variants.txt" "$R/r2_atwdec.txt"
for r in 1 2; do
    for p in standard high; do
        echo "=== $p $r" >> "$R/r2_precision.txt"
        timeout --foreground 55 /tmp/rw-variants/rw-base --config tools/configs/qwen3-30b-a3b.json \
            decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant \
            --precision $p >> "$R/r2_precision.txt" 2>&1
    done
done
python3 tools/bench/variant_lines.py "$R/r2_variants.txt" | tail -30
python3 tools/bench/variant_lines.py "$R/r2_atwdec.txt" | tail -12
grep -h '"what": "decode' "$R/r2_precision.txt" | cut -c1-200 | head -20
