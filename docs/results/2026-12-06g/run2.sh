#!/usr/bin/env bash
# Session 39, call 2. The quantized (mxfp8) expert layers' gate/up input as one bf16 instead of
# the hi + lo pair (one: RW_MOE_QUANT_PAIR=0 in worker/cuda_forward.c; one8: the same with eight
# stages for the two-warpgroup mxfp8 tiles, MOE_MX_WG_STAGES=8, which the 12 KB stages of the
# unsplit tile leave room for at two CTAs an SM) and the mxfp8 tiles' e4m3 stages loaded by one
# tensor copy each (tma: MOE_MX_TMA=1, the pair kept) against main, mxfp8-last-8 and bf16
# decode at b256 (x 512 on an H100; x 1k with b1 on an H200: the target command), two rounds;
# then, with what time is left, the quantized expert and CUDA-vs-CPU tests on the one-input and
# tensor-copy trees (tests_one.txz, tests_tma.txz: the quantized models' max logit difference
# against the CPU backend) and the CUDA-vs-CPU test on main's.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader)
echo "$gpu" | tee "$R/r2_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-520} # seconds this script may take in all
VT=$((B * 3 / 5))
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then P="--batches 1,256 --ctxs 1024"; else P="--batches 256 --ctxs 512"; fi
OUT=$R/v RW_VARIANT_TIMEOUT=80 timeout $VT tools/gpu/run-variants.sh --rounds 2 ${RW_VARIANTS:-main one one8 tma} -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/r2_variants.txt"; rm -rf "$R/v"
echo "variants done at $((SECONDS - s0)) s"
for t in one tma main; do
    left=$((B - (SECONDS - s0)))
    [ $left -lt 30 ] && { echo "no time left for tests_$t"; continue; }
    only="moe_experts_gpu|worker_cuda_vs_transformers_gpu"
    [ $t = tma ] && only="moe_experts_gpu"
    [ $t = main ] && only="worker_cuda_vs_transformers_gpu"
    [ $left -gt 100 ] && left=100
    timeout $left tools/gpu/run-packed.sh .gpu-pack/tests_$t.txz --only "$only" > "$R/r2_tests_$t.txt" 2>&1
    tail -4 "$R/r2_tests_$t.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
    [ -f "$R/failed.log" ] && tail -c 2000 "$R/failed.log" && mv "$R/failed.log" "$R/r2_failed_$t.log"
    echo "tests $t done at $((SECONDS - s0)) s"
done
