#!/usr/bin/env bash
# Prepared in session 28, not run: why q/k/v on the 64 x 64 wgmma tile depends on the token count
# (r19: 24.4 us at 16 tokens, 15.5 at 24, 21.5 at 32, 12.3 at 64, with the same 80-CTA grid and
# weight bytes). Nsight Compute's sections for one launch at 16, 24 and 64 tokens (the sweep build,
# RW_GEMM_TILE=64,64,1); compare DRAM throughput, L2 hit rate, stall reasons.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
d=/tmp/rw-sweep
[ -x "$d/rw-sweep" ] || { rm -rf "$d" && mkdir -p "$d" && tar xf .gpu-pack/variants_sweep.txz -C "$d"; }
for m in 16 24 64; do
    RW_GEMM_TILE=64,64,1 timeout 120 ncu -k "regex:^gemm_kernel" --launch-skip 4 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section LaunchStats \
        "$d/rw-sweep" --config "$(pwd)/tools/configs/qwen3-30b-a3b.json" kernels \
        --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens $m --reps 5 \
        > "$R/r21_ncu_qkv64_m$m.txt" 2>&1
    grep -E "gemm_kernel<|Duration|DRAM Throughput|L2 Hit|Eligible Warps|Stall" "$R/r21_ncu_qkv64_m$m.txt" | head -12
done
