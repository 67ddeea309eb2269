#!/usr/bin/env bash
# Forty-seventh session: the prefill attention kernel's instructions outside its softmax blocks
# cut, same bits intended: epi (epi.patch: the merged o as a float4 a lane and fragment, the
# segment merge by selects, the final stores two columns at a time with each row's index once)
# and all (all.patch: epi plus the copies' block ids read a segment ahead, atc_seg_ids), allu
# (allu.patch: all with the two softmax blocks' loop unrolled, 2026-12-07e/unroll.patch). On any
# card, each part where what is left of RW_CALL_BUDGET seconds allows: main, epi, all, allu in
# turns on the kernel alone; allu's attention, invariance, kernels and CUDA-vs-transformers tests;
# an 8 x 2k prefill of main and allu (G4's line); Nsight Compute of all's kernel.
# Archives: .gpu-pack/variants.txz (main = 9bbf8c4, epi, all, allu), .gpu-pack/tests_allu.txz.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/h_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-400}
left() { echo $((B - (SECONDS - s0))); }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 120 tools/gpu/run-variants.sh --rounds 2 main epi all allu -- $C kernels \
    --kernel-attention p8x2048,p1x8192 --expert-tokens 1 --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/h_kernels.txt"
python3 tools/bench/variant_lines.py "$R/h_kernels.txt" --what 'attention'
echo "kernels at $((SECONDS - s0)) s"
if [ "$(left)" -ge 60 ]; then
    t=$(left); [ $t -gt 150 ] && t=150
    timeout $t tools/gpu/run-packed.sh .gpu-pack/tests_allu.txz \
        --only 'attention|invariance|kernels_gpu|transformers' > "$R/h_tests.txt" 2>&1
    echo "tests exit $? at $((SECONDS - s0)) s"; tail -n 12 "$R/h_tests.txt"
    [ -f "$R/failed.log" ] && tail -n 40 "$R/failed.log"
    rm -f "$R/suite.txt"
fi
if [ "$(left)" -ge 90 ]; then
    RW_VARIANT_TIMEOUT=$((($(left) - 15) / 2)) timeout $(($(left) - 10)) \
        tools/gpu/run-variants.sh --rounds 1 main allu -- $C prefill --prefill-reps 2 --no-quant \
        > /dev/null 2>&1
    mv "$R/variants.txt" "$R/h_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/h_prefill.txt" --what 'prefill'
fi
if [ "$(left)" -ge 60 ] && command -v ncu > /dev/null; then
    timeout $(($(left) - 10)) ncu --kernel-name-base demangled -k regex:atc_kernel --launch-skip 2 \
        --launch-count 1 --set full --import-source no -f -o "$R/ncu_atc" /tmp/rw-variants/rw-all $C \
        kernels --kernel-attention p8x2048 --expert-tokens 1 --dense-tokens 1 --reps 2 --warmup 1 \
        > /tmp/ncu_run.log 2>&1
    echo "ncu exit $? at $((SECONDS - s0)) s"
    ncu --import "$R/ncu_atc.ncu-rep" --page source --csv --print-source sass > /tmp/ncu_sass.csv 2>&1
    python3 tools/bench/sass_table.py /tmp/ncu_sass.csv --top 30 > "$R/h_ncu_all_sass.txt" 2>&1
    rm -f "$R/ncu_atc.ncu-rep"
    head -32 "$R/h_ncu_all_sass.txt"
fi
echo "all took $((SECONDS - s0)) s"
