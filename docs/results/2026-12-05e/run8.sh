#!/usr/bin/env bash
# Session 26, call 2 (after run5: suite passes on main + all5; quarter and clusters lose; tn96
# and wgdeep gain on one round): b1 and b256 steps for base, smp1pass and all5 (two rounds), then
# the dense GEMMs at 64 and 256 tokens for base, tn96 and wgdeep over three rounds.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=90 timeout 330 tools/gpu/run-variants.sh --rounds 2 \
    --archive .gpu-pack/variants_smp.txz base smp1pass all5 -- \
    $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant
mv "$R/variants.txt" "$R/r8_decode.txt"
python3 tools/bench/variant_lines.py "$R/r8_decode.txt" | grep -A4 '^decode'
RW_VARIANT_TIMEOUT=40 timeout 200 tools/gpu/run-variants.sh --rounds 3 \
    --archive .gpu-pack/variants_s25.txz base tn96 wgdeep -- \
    $C kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 64,256
mv "$R/variants.txt" "$R/r8_dense.txt"
python3 tools/bench/variant_lines.py "$R/r8_dense.txt" | grep -A4 '^dense'
