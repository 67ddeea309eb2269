#!/usr/bin/env bash
# Forty-seventh session, on an H100: sb64 (one softmax block of 64 keys instead of two of 32,
# sb64.patch: other bits, timing only) and the three prepared orders of the prefill kernel's two
# softmax blocks (docs/results/2026-12-07e: pipe, mid, unroll) against main in turns, the
# prefill attention kernel alone, then the attention GPU tests of 9bbf8c4 (the
# ready-counter helper, never run on a GPU); between them Nsight Compute of main's prefill kernel
# at 8 x 2k (warp states, the SASS page: where its warps wait).
# Archives: .gpu-pack/variants.txz (main = 9bbf8c4's device code; sb64 = main with sb64.patch;
# pipe, mid, unroll = main with 2026-12-07e's patches), .gpu-pack/tests_head.txz (9bbf8c4's gpu suite).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/g_gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=30 timeout 200 tools/gpu/run-variants.sh --rounds 2 main sb64 mid unroll pipe -- $C \
    kernels --kernel-attention p8x2048,p1x8192 --expert-tokens 1 --dense-tokens 1 > /dev/null 2>&1
echo "variants exit $? at $((SECONDS - s0)) s"
mv "$R/variants.txt" "$R/g_kernels.txt"
python3 tools/bench/variant_lines.py "$R/g_kernels.txt" --what 'attention'
X=/tmp/rw-variants/rw-main
if command -v ncu > /dev/null; then
    timeout 150 ncu --kernel-name-base demangled -k regex:atc_kernel --launch-skip 2 --launch-count 1 \
        --set full --import-source no -f -o "$R/ncu_atc" $X $C kernels --kernel-attention p8x2048 \
        --expert-tokens 1 --dense-tokens 1 --reps 2 --warmup 1 > /tmp/ncu_run.log 2>&1
    echo "ncu exit $? at $((SECONDS - s0)) s"
    ncu --import "$R/ncu_atc.ncu-rep" --page details > "$R/g_ncu_atc.txt" 2>&1
    ncu --import "$R/ncu_atc.ncu-rep" --page source --csv --print-source sass > /tmp/ncu_sass.csv 2>&1
    python3 tools/bench/sass_table.py /tmp/ncu_sass.csv --top 40 > "$R/g_ncu_atc_sass.txt" 2>&1
    rm -f "$R/ncu_atc.ncu-rep"
    grep -E "Duration|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Warp Cycles Per Issued" "$R/g_ncu_atc.txt" | head -12
    head -40 "$R/g_ncu_atc_sass.txt"
fi
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_head.txz --only 'attention' > "$R/g_tests.txt" 2>&1
echo "tests exit $? at $((SECONDS - s0)) s"
tail -8 "$R/g_tests.txt"
rm -f "$R/suite.txt"
echo "all took $((SECONDS - s0)) s"
