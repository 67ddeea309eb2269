#!/usr/bin/env bash
# Session 31, call 3: SPLIT_MAX 16 (base: main) against 32 and 64 on main's tree (run9 measured
# them on the oproj-merge branch, whose b1 x 2k steps merge in o_proj). b1 and b2 at 1k, 2k, 4k,
# 8k, three alternating rounds.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=90 tools/gpu/run-variants.sh --rounds 3 base s32 s64 -- \
    $C decode --batches 2,1 --ctxs 1024,2048,4096,8192 --steps 20 --gen 1,16,2 --gen-reps 1 \
    --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/variants.txt" | grep -A3 "^decode_bf16 "
