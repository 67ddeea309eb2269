#!/usr/bin/env bash
# Forty-eighth session, last call: two stage schedules of the 128-token expert tiles after the
# grid order (same bits):
#   nopipe  w13 (input pair, 4 stages) without a group kept in flight: three blocks of copies
#           ahead instead of two, each block's MMAs retired before the next
#   w2p4    w2 (one input) on 4 stages, pipelined (one CTA an SM) instead of 3 (two CTAs)
# The expert layer at 16,384 tokens in turns, then the 8 x 2k prefill.
# Archive: tools/gpu/pack-variants.sh BUILD main=- nopipe=nopipe.patch w2p4=w2p4.patch (main of c8b7f44)
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/h_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-200}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --rounds 2 main nopipe w2p4 \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384 --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/h_kernels.txt"
python3 tools/bench/variant_lines.py "$R/h_kernels.txt" --what 'experts_t'
echo "kernels at $((SECONDS - s0)) s"
RW_VARIANT_TIMEOUT=40 timeout $((B - 10 - (SECONDS - s0))) tools/gpu/run-variants.sh --rounds 1 \
    main nopipe w2p4 -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
mv "$R/variants.txt" "$R/h_prefill.txt"
python3 tools/bench/variant_lines.py "$R/h_prefill.txt" --what 'prefill_bf16'
echo "all took $((SECONDS - s0)) s"
