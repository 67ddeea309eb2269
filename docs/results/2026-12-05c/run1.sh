#!/usr/bin/env bash
# Session 24, call 1: the copy probe; attention variants (T form in split launches, 256-key
# segments) and the L2 promotion patch; Nsight Compute on the 32 x 8k split kernel and combine.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 100 python3 tools/gpu/hbm_probe.py > "$R/r1_hbm_probe.txt" 2>&1
cat "$R/r1_hbm_probe.txt"
RW_VARIANT_TIMEOUT=50 timeout 250 tools/gpu/run-variants.sh --rounds 2 base tsplit seg256 -- \
    $C kernels --kernel-attention d32x8192,d8x8192,d8x4096,d1x1024,d256x1024 --expert-tokens 1 --dense-tokens 1
mv "$R/variants.txt" "$R/r1_attn_variants.txt"
python3 tools/bench/variant_lines.py "$R/r1_attn_variants.txt" | grep -A4 attention
B=/tmp/rw-variants/rw-base
timeout 120 ncu --kernel-name-base demangled -k regex:'atc_decode_kernel|atc_combine' --launch-skip 4 --launch-count 2 \
    --set full --import-source no -f -o "$R/ncu32x8k" "$B" $C kernels --kernel-attention d32x8192 \
    --expert-tokens 1 --dense-tokens 1 --reps 2 --warmup 1 > "$R/r1_ncu_run.log" 2>&1
ncu --import "$R/ncu32x8k.ncu-rep" --page details > "$R/r1_ncu_32x8k.txt" 2>&1
rm -f "$R/ncu32x8k.ncu-rep"
grep -E 'atc_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible|Theoretical Occ|dram__bytes' "$R/r1_ncu_32x8k.txt" | head -40
