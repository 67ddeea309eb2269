#!/usr/bin/env bash
# Forty-eighth session: what 2897316's grid order did to the quantized decode tiles. prev is main
# with that commit's kernel change reverted (prev.patch); b256 x 512 bf16 steps and mxfp8-last-8
# steps at the G1 point (256 x 1k; fits an H100), in turns.
# Archive: tools/gpu/pack-variants.sh BUILD main=- prev=prev.patch
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/f_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-300}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=110 timeout $((B - 10)) tools/gpu/run-variants.sh --rounds 2 main prev -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/f_decode.txt"
python3 tools/bench/variant_lines.py "$R/f_decode.txt" --what "decode_bf16|decode_mxfp8"
echo "all took $((SECONDS - s0)) s"
