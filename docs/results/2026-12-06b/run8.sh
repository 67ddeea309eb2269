#!/usr/bin/env bash
# Session 34, call 8: rearly = main with the RoPE kernel letting the attention be scheduled before
# its own wait (rw_pdl_begin_early; the attention reads only the step's metadata before its
# wait), without fresh's copies: whether early's b8 x 1k gain came from the attention's
# residency alone. b8 and b1 at 1k and 4k (three rounds in turns), b256 x 512 (two rounds).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r8_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r8_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r8_all.tgz .); }
trap 'archive; exit 143' TERM
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base rearly"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r8_steps.txt"
OUT=$R/b256 RW_VARIANT_TIMEOUT=90 timeout 200 tools/gpu/run-variants.sh --rounds 2 $V -- $C \
    decode --batches 256 --ctxs 512 --steps 20 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16" | tee "$R/r8_b256.txt"
echo "all took $((SECONDS - s0)) s"
archive
