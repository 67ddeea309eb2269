#!/usr/bin/env bash
# Prepared in the forty-eighth session, not run: what the w13 pass's top stall (the wait on each
# stage's weight copy, b_ncu_moe_sass.txt) waits for. Timing only (the results are wrong):
#   noA   the 128-token tensor-copy tiles skip their weight copies and the wait on them
#   noB   the same tiles read no token rows (the copies zero-fill)
#   noAB  both: the MMAs, barriers and address work alone
# If noA is near noAB, the weights' arrival holds the pass; if noB gains as much, the token rows'
# traffic delays the weights (they share L2 and DRAM); if neither, the loop itself does. Both
# passes take the tensor copies at 128 tokens, so the line (the whole layer) moves with both. The
# expert layer at 16,384 tokens in turns, on any card (~1 min).
# Archive: tools/gpu/pack-variants.sh BUILD main=- noA=noA.patch noB=noB.patch noAB=noAB.patch
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/q_gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 110 tools/gpu/run-variants.sh --rounds 2 main noA noB noAB \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/q_kernels.txt"
python3 tools/bench/variant_lines.py "$R/q_kernels.txt" --what 'experts_t'
echo "all took $((SECONDS - s0)) s"
