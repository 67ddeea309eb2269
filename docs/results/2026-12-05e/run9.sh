#!/usr/bin/env bash
# Session 26, call 3: the gpu suite on main + keep256 (tests_s26: the 128 x 96 one-wave tile,
# deeper wgmma stages, the sampler's one-load chunk passes, the 128 x 256 lm_head tile); then
# the dense GEMMs (three rounds) and the b1 / b256 steps (two rounds; ctx 512, since b256 x 1k
# does not fit an H100 beside the weights) for base, keep and keep256.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 270 tools/gpu/run-packed.sh .gpu-pack/tests_s26.txz > "$R/r9_suite.txt" 2>&1
tail -4 "$R/r9_suite.txt"
grep -E "FAIL|gemm|kernels" "$R/r9_suite.txt" | head
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r9_failed.log"
rm -f "$R/suite.txt"
RW_VARIANT_TIMEOUT=40 timeout 120 tools/gpu/run-variants.sh --rounds 3 \
    --archive .gpu-pack/variants_s26.txz base keep keep256 -- \
    $C kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 64,256,2048
mv "$R/variants.txt" "$R/r9_dense.txt"
python3 tools/bench/variant_lines.py "$R/r9_dense.txt" | grep -A4 '^dense'
RW_VARIANT_TIMEOUT=90 timeout 190 tools/gpu/run-variants.sh --rounds 2 \
    --archive .gpu-pack/variants_s26.txz base keep keep256 -- \
    $C decode --batches 1,256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant
mv "$R/variants.txt" "$R/r9_decode.txt"
python3 tools/bench/variant_lines.py "$R/r9_decode.txt" | grep -A4 '^decode'
