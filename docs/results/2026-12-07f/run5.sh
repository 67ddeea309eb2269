#!/usr/bin/env bash
# Prepared in the forty-seventh session, not run: what is left of the attention kernels' work
# outside their softmax blocks, on any card, each part where what is left of RW_CALL_BUDGET
# seconds allows (same bits intended for all but noids' question, which is only speed):
#   noids  the prefill kernel without the copies' block ids read a segment ahead (alone they
#          measured level to slower; is the landed unrolled form faster without them?)
#   mfast  the prefill kernel's segment merge without selects when both of a lane's rows merge
#   dec    the decode kernel's merge and final stores with each register's slot known at
#          compile time (no atc_pick selects, no branch an element, each row's index once)
#   next   mfast + dec (the GPU tests run on this one)
# Kernels alone in turns (prefill 8 x 2k, 1 x 8k; decode 256 x 1k, 32 x 8k, 1 x 1k), next's
# attention, kernels, invariance and CUDA-vs-transformers tests, then decode steps b1 / b256 x
# 512 of main and next (fits an H100), where time is left.
# Archives (on a fresh checkout; F=docs/results/2026-12-07f):
#   tools/gpu/pack-variants.sh BUILD main=- noids=$PWD/$F/noids.patch mfast=$PWD/$F/mfast.patch \
#       dec=$PWD/$F/dec.patch next=$PWD/$F/next.patch
#   git apply $F/next.patch && tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_next.txz &&
#       git apply -R $F/next.patch
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/k_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-400}
left() { echo $((B - (SECONDS - s0))); }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 180 tools/gpu/run-variants.sh --rounds 2 main noids mfast dec next \
    -- $C kernels --kernel-attention p8x2048,p1x8192,d256x1024,d32x8192,d1x1024 \
    --expert-tokens 1 --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/k_kernels.txt"
python3 tools/bench/variant_lines.py "$R/k_kernels.txt" --what 'attention'
echo "kernels at $((SECONDS - s0)) s"
if [ "$(left)" -ge 60 ]; then
    t=$(left); [ $t -gt 150 ] && t=150
    timeout $t tools/gpu/run-packed.sh .gpu-pack/tests_next.txz \
        --only 'attention|invariance|kernels_gpu|transformers' > "$R/k_tests.txt" 2>&1
    echo "tests exit $? at $((SECONDS - s0)) s"; tail -n 12 "$R/k_tests.txt"
    [ -f "$R/failed.log" ] && tail -n 40 "$R/failed.log"
    rm -f "$R/suite.txt"
fi
if [ "$(left)" -ge 100 ]; then
    RW_VARIANT_TIMEOUT=$((($(left) - 15) / 2)) timeout $(($(left) - 10)) \
        tools/gpu/run-variants.sh --rounds 1 main next -- $C decode --batches 1,256 --ctxs 512 \
        --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/k_decode.txt"
    python3 tools/bench/variant_lines.py "$R/k_decode.txt" --what 'decode'
fi
echo "all took $((SECONDS - s0)) s"
