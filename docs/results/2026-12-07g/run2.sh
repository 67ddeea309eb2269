#!/usr/bin/env bash
# Forty-eighth session: the expert layer's chunk. A call runs its tokens in chunks of
# RW_MOE_CUDA_CHUNK (4096) tokens, and every chunk reads all of the layer's expert weights again
# (1.2 GB for Qwen3-30B-A3B: about 0.4 ms of a 1.4 ms chunk at 16,384 tokens).
#   ch8k, ch16k  chunks of 8192 and 16,384 tokens (a larger workspace: y is [chunk k, H] fp32)
# Same bits (a token's rows do not depend on the others). The experts at 16,384 and 4096 tokens
# in turns, the 8 x 2k prefill of the three, then Nsight Compute of main's w13 and w2 passes at
# 16,384 tokens (after the grid order of 2897316).
# Archive: tools/gpu/pack-variants.sh BUILD main=- ch8k=ch8k.patch ch16k=ch16k.patch
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/b_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-400}
left() { echo $((B - (SECONDS - s0))); }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 2 main ch8k ch16k \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,4096 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/b_kernels.txt"
python3 tools/bench/variant_lines.py "$R/b_kernels.txt" --what 'experts'
echo "kernels at $((SECONDS - s0)) s"
if [ "$(left)" -ge 60 ]; then
    RW_VARIANT_TIMEOUT=40 timeout 140 tools/gpu/run-variants.sh --rounds 1 main ch8k ch16k \
        -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/b_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/b_prefill.txt" --what 'prefill'
    grep -h "out of memory\|error" "$R/b_prefill.txt" | head -5
    echo "prefill at $((SECONDS - s0)) s"
fi
if [ "$(left)" -ge 90 ]; then
    X=/tmp/rw-variants/rw-main
    RW_BENCH=$X OUT=/tmp/kp timeout 150 tools/gpu/kernel-profile.sh --kernels \
        "--kernel-attention p1x128 --expert-tokens 16384 --dense-tokens 1 --reps 1 --warmup 1" \
        --skip 2 --count 2 moe_gemm_kernel > "$R/b_ncu_moe_sass.txt" 2>&1
    echo "kernel-profile exit $? at $((SECONDS - s0)) s"
    cp /tmp/kp/profile.txt "$R/b_ncu_moe.txt"
    grep -E "moe_gemm_kernel|Duration|Issue Slots Busy|No Eligible|Achieved Occupancy|DRAM Throughput|L2 Hit|Compute \(SM\)" \
        "$R/b_ncu_moe.txt" | head -24
    grep -A14 "most stall" "$R/b_ncu_moe_sass.txt" | head -34
fi
echo "all took $((SECONDS - s0)) s"
