#!/usr/bin/env bash
# Session 31, call 2 (after run8.sh): SPLIT_MAX 16 (m18, the tree) against 32 (s32) and 64 (s64)
# from the same variants.txz: at b1 x 4k (s32) and b1 x 8k (s64) every split CTA holds one
# segment and takes the whole-segment path; b2 takes more splits too; b4 and up pick fewer.
# Three alternating rounds at b1 and b2 x 2k, 4k, 8k (m18 merges in o_proj only up to 18
# token-segments, so 2k and up run the combine kernel in all three).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r9_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
s0=$SECONDS
RW_VARIANT_TIMEOUT=90 tools/gpu/run-variants.sh --rounds 3 m18 s32 s64 -- \
    $C decode --batches 2,1 --ctxs 2048,4096,8192 --steps 20 --gen 1,16,2 --gen-reps 1 \
    --no-quant --no-forward
echo "variants done at $((SECONDS - s0)) s"
python3 tools/bench/variant_lines.py "$R/variants.txt" | grep -E "decode_bf16 " | head -40
