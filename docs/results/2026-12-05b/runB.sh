#!/usr/bin/env bash
# Call 2 again with the config named (the variants' default config path is the build's source tree).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 230 tools/gpu/run-variants.sh --rounds 2 base noet kbm kbm8 l2p128 l2p0 -- \
    $C decode --batches 1,8 --ctxs 1024,4096 --steps 20 --gen 1,16,2 --gen-reps 2 --no-quant
mv "$R/variants.txt" "$R/r2_variants.txt"
RW_VARIANT_TIMEOUT=40 timeout 150 tools/gpu/run-variants.sh --rounds 2 base atwdec -- \
    $C kernels --kernel-attention d32x8192,d8x8192,d8x4096,d1x1024 --expert-tokens 1 --dense-tokens 1
mv "$R/variants.txt" "$R/r2_atwdec.txt"
python3 tools/bench/variant_lines.py "$R/r2_variants.txt" | tail -40
python3 tools/bench/variant_lines.py "$R/r2_atwdec.txt" | tail -16
