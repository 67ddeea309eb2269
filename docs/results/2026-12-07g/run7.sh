#!/usr/bin/env bash
# Prepared in the forty-eighth session, not run: where the expert passes switch from 32-token to
# 128-token tiles (moe_tn: more than 48 rows an expert take 128), measured before the grid order
# of 2897316 changed both tiles' costs. th32 / th96 move the switch to 32 / 96 rows an expert
# (th32.patch, th96.patch). Same bits (a row's arithmetic does not depend on the tile width:
# test_moe_experts_gpu). The expert layer at 384, 512, 768, 1024 and 1536 tokens (24 to 96 rows
# an expert of Qwen3-30B-A3B's 128 experts at top-8) in turns, on any card.
# Archive: tools/gpu/pack-variants.sh BUILD main=- th32=th32.patch th96=th96.patch
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/t_gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 150 tools/gpu/run-variants.sh --rounds 2 main th32 th96 \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 384,512,768,1024,1536 \
    --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/t_kernels.txt"
python3 tools/bench/variant_lines.py "$R/t_kernels.txt" --what 'experts_t'
echo "all took $((SECONDS - s0)) s"
