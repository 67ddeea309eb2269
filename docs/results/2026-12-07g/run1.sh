#!/usr/bin/env bash
# Forty-eighth session: the expert GEMM's grid order. Nsight Compute of the 16,384-token passes
# (m_ncu_moe*.txt) read 1.95 GB from DRAM in the w13 pass (the weights are 0.8 GB) and ran the w2
# pass at 85% of DRAM bandwidth: a wave of token tiles along x held one weight row block of a
# hundred-odd tiles, whose gathered token rows and weights did not fit L2 together.
#   nfast128  the 128-token (prefill) tiles with the weight row blocks along x, tiles along y
#   nfast     every tile so (decode tiles too)
# Same bits (only which CTA runs when). Kernels in turns, the 8 x 2k prefill of main and
# nfast128, nfast's GPU tests, decode b256 x 512 of main and nfast, where time is left.
# Archives: tools/gpu/pack-variants.sh BUILD main=- nfast128=P1 nfast=P2 (P1 = nfast128.patch,
# P2 = nfast.patch); git apply nfast.patch && tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_nfast.txz
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/a_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-400}
left() { echo $((B - (SECONDS - s0))); }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=60 timeout 240 tools/gpu/run-variants.sh --rounds 2 main nfast128 nfast \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048,256 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/a_kernels.txt"
python3 tools/bench/variant_lines.py "$R/a_kernels.txt" --what 'experts'
echo "kernels at $((SECONDS - s0)) s"
if [ "$(left)" -ge 60 ]; then
    RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --rounds 1 main nfast128 \
        -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/a_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/a_prefill.txt" --what 'prefill'
    echo "prefill at $((SECONDS - s0)) s"
fi
if [ "$(left)" -ge 60 ]; then
    t=$(left); [ $t -gt 150 ] && t=150
    timeout $t tools/gpu/run-packed.sh .gpu-pack/tests_nfast.txz \
        --only 'moe|attention|invariance|kernels_gpu|transformers' > "$R/a_tests.txt" 2>&1
    echo "tests exit $? at $((SECONDS - s0)) s"; tail -n 14 "$R/a_tests.txt"
    [ -f "$R/failed.log" ] && tail -n 40 "$R/failed.log"
    rm -f "$R/suite.txt"
fi
if [ "$(left)" -ge 80 ]; then
    RW_VARIANT_TIMEOUT=$((($(left) - 15) / 2)) timeout $(($(left) - 10)) \
        tools/gpu/run-variants.sh --rounds 1 main nfast -- $C decode --batches 256 --ctxs 512 \
        --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/a_decode.txt"
    python3 tools/bench/variant_lines.py "$R/a_decode.txt" --what 'decode'
fi
echo "all took $((SECONDS - s0)) s"
