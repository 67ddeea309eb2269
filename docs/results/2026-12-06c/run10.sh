#!/usr/bin/env bash
# Session 35, call 10: the expert combine + norm waiting without letting the q/k/v GEMV be
# scheduled until it ends (cnlate.patch). Call 6's stamps: at b1 that one-CTA kernel takes 5.9 us
# past its wait (3.2 alone with its launch) while the GEMV's CTAs stream their first 10.5 MB
# of weights under it. Same bits expected (only scheduling changes). b8 / b1 at 1k and 4k in three
# rounds, b256 x 512 in two. Archive: pack-variants base=- cnlate=cnlate.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r10_gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base cnlate"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r10_steps.txt"
OUT=$R/b256 RW_VARIANT_TIMEOUT=90 timeout 200 tools/gpu/run-variants.sh --rounds 2 $V -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16" | tee "$R/r10_b256.txt"
mv "$R/steps/variants.txt" "$R/r10_steps_variants.txt"; mv "$R/b256/variants.txt" "$R/r10_b256_variants.txt"
rm -rf "$R/steps" "$R/b256"
echo "all took $((SECONDS - s0)) s"
